/*
 * failure.c - a rank dies in the middle of communication.
 *
 * Every rank exchanges messages around a ring (eager and rendezvous sizes,
 * nonblocking, so that a transfer is in flight when it happens); after a
 * few rounds the last rank calls exit(1) without MPI_Finalize while the
 * others are blocked waiting for it.  The job must end - mpirun reports the
 * failure and exits non-zero - instead of hanging.  run-apps.sh runs this
 * under a timeout: a zero exit status or the timeout is a failure.
 *
 * usage: failure [ROUND]     (the round in which the last rank exits: 20)
 */
#include "apps_common.h"

#define ROUNDS 1000000
#define LEN    (256 * 1024)

int main(int argc, char **argv)
{
    int die_round = 20;
    char *sbuf, *rbuf;
    int left, right;

    app_init(&argc, &argv, "failure");
    if (argc > 1) {
        die_round = atoi(argv[1]);
    }
    CHECK(app_size >= 2, "needs at least 2 ranks");
    left  = (app_rank + app_size - 1) % app_size;
    right = (app_rank + 1) % app_size;
    sbuf  = xmalloc(LEN);
    rbuf  = xmalloc(LEN);
    memset(sbuf, app_rank, LEN);

    for (int round = 0; round < ROUNDS; ++round) {
        MPI_Request req[2];
        size_t len = (round % 2) ? LEN : 64;

        MPI_CHECK(MPI_Irecv(rbuf, (int)len, MPI_BYTE, left, round,
                            MPI_COMM_WORLD, &req[0]));
        MPI_CHECK(MPI_Isend(sbuf, (int)len, MPI_BYTE, right, round,
                            MPI_COMM_WORLD, &req[1]));
        if ((app_rank == app_size - 1) && (round == die_round)) {
            printf("failure: rank %d exits with status 1 in round %d, "
                   "transfers in flight\n", app_rank, round);
            fflush(stdout);
            exit(1);
        }
        MPI_CHECK(MPI_Waitall(2, req, MPI_STATUSES_IGNORE));
        CHECK((unsigned char)rbuf[len - 1] == (unsigned char)left,
              "round %d: wrong data from %d", round, left);
        if (round == die_round + 1000) {
            /* Still running long after the peer died: the others never
             * noticed (a ring cannot make progress without it). */
            FAIL("round %d reached although rank %d exited in round %d",
                 round, app_size - 1, die_round);
        }
    }
    app_finish();
    return 0;
}
