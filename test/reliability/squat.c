/*
 * squat.c - claim the names the hca device will use for processes that do
 * not exist yet (run as an unprivileged user by uid-isolation.sh).
 *
 * usage: squat COUNT DIR
 *
 * For each of the next COUNT pids after /proc/sys/kernel/ns_last_pid, and
 * device context 0 (the first hca_device_open of a process): binds the
 * abstract AF_UNIX datagram names "hca.<pidns>.<pid>.0.svc" and
 * ".cq0".."cq3" (hca_device.c: hca_notify_addr) and creates the shared
 * memory object "/hca.<pidns>.<pid>.0.ctx0" (hca_memobj.c: hca_obj_name) with
 * mode 0600.  Abstract names have no permissions and the device context
 * object is created with O_EXCL, so a device that trusts these names can
 * be kept from opening, or worse.  Writes DIR/squat.ready ("first last
 * sockets shm") and waits; on SIGTERM it removes its objects and exits.
 */
#include "rel_common.h"

#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

const char *rel_prog = "squat";

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static int bind_abstract(const char *name)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n  = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "%s", name);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    if ((fd >= 0) &&
        (bind(fd, (struct sockaddr*)&sa,
              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) !=
         0)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int main(int argc, char **argv)
{
    unsigned count, last, pid_max, pidns, sockets = 0, shm = 0;
    struct rlimit rl;
    struct stat st;
    char name[128];
    FILE *f;

    if (argc != 3) {
        fprintf(stderr, "usage: squat COUNT DIR\n");
        return 2;
    }
    count = (unsigned)atoi(argv[1]);
    if ((stat("/proc/self/ns/pid", &st) != 0) ||
        !(f = fopen("/proc/sys/kernel/pid_max", "r")) ||
        (fscanf(f, "%u", &pid_max) != 1) || (fclose(f) != 0) ||
        !(f = fopen("/proc/sys/kernel/ns_last_pid", "r")) ||
        (fscanf(f, "%u", &last) != 1) || (fclose(f) != 0)) {
        rel_die("cannot read the pid namespace");
    }
    pidns = (unsigned)st.st_ino;
    /* 5 sockets per pid stay open */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGTERM, on_term);
    for (unsigned i = 1; i <= count; ++i) {
        unsigned pid = (last + i) % pid_max;
        int fd;

        snprintf(name, sizeof(name), "hca.%u.%u.0.svc", pidns, pid);
        sockets += (bind_abstract(name) >= 0);
        for (int cq = 0; cq < 4; ++cq) {
            snprintf(name, sizeof(name), "hca.%u.%u.0.cq%d", pidns, pid, cq);
            sockets += (bind_abstract(name) >= 0);
        }
        snprintf(name, sizeof(name), "/hca.%u.%u.0.ctx0", pidns, pid);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            ++shm;
            close(fd);
        }
    }
    rel_put_text(argv[2], "squat.ready", "%u %u %u %u\n",
                 (last + 1) % pid_max, (last + count) % pid_max, sockets, shm);
    while (!stop) {
        pause();
    }
    for (unsigned i = 1; i <= count; ++i) {
        snprintf(name, sizeof(name), "/hca.%u.%u.0.ctx0", pidns,
                 (last + i) % pid_max);
        shm_unlink(name);
    }
    return 0;
}
