/*
 * googletest entry point for gtest_uct: the hca UCT transport (and UCP over
 * it) through UCX's public API.  Stock UCX 1.13 sees the transport only
 * when libuct_hca.so is preloaded:
 *
 *   LD_PRELOAD=<builddir>/src/uct/hca/.libs/libuct_hca.so ./gtest_uct
 *
 * (`make check` does that.)  Without it every test fails at its first
 * uct_md_open; this main says so once, up front.
 */
#include <gtest/gtest.h>

#include <uct/api/uct.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

static bool hca_component_loaded()
{
    uct_component_h *comps;
    unsigned n;
    bool found = false;

    if (uct_query_components(&comps, &n) != UCS_OK) {
        return false;
    }
    for (unsigned i = 0; i < n; ++i) {
        uct_component_attr_t attr;
        attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        if ((uct_component_query(comps[i], &attr) == UCS_OK) &&
            !strcmp(attr.name, "hca")) {
            found = true;
        }
    }
    uct_release_component_list(comps);
    return found;
}

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);

    /* a peer process that dies must not kill us through a pipe */
    signal(SIGPIPE, SIG_IGN);

    if (!hca_component_loaded()) {
        fprintf(stderr,
                "gtest_uct: the UCT component 'hca' is not loaded; run with "
                "LD_PRELOAD=<builddir>/src/uct/hca/.libs/libuct_hca.so\n");
    }
    return RUN_ALL_TESTS();
}
