/* test_cli.c — how a rank picks its CUDA device (explicit --device, local rank % --gpus-per-node,
 * the local rank; bad values refused), including the multi-node layouts mpirun produces, and the
 * checked option parsers the subcommands share (whole-string integers and finite reals within a
 * range, errors that name the option and the value). */
#include "test.h"

#include "formats/common.h"
#include "runtime/engine.h"
/* The parsers live with the command line (tools/ is not in the library); test them in place. */
#include "tools/cli.c"

#include <float.h>

static bool err_has(const char *a, const char *b) {
    return strstr(pln_error(), a) != NULL && (!b || strstr(pln_error(), b) != NULL);
}

static void test_pick_device(void) {
    /* Explicit device: the same on every rank, whatever the local rank or --gpus-per-node. */
    CHECK(pln_engine_pick_device(3, 0, 5) == 3, "--device 3 on local rank 5");
    CHECK(pln_engine_pick_device(0, 2, 7) == 0, "--device 0 beats --gpus-per-node 2");
    CHECK(pln_engine_pick_device(0, 0, 0) == 0, "--device 0 on local rank 0");
    /* Unset: one process per GPU, the node-local rank. */
    for (int l = 0; l < 8; l++) CHECK(pln_engine_pick_device(-1, 0, l) == l, "local rank %d -> device %d", l, l);
    /* --gpus-per-node N: local rank modulo N. */
    CHECK(pln_engine_pick_device(-1, 4, 6) == 2, "local 6, 4 GPUs -> 2");
    CHECK(pln_engine_pick_device(-1, 8, 7) == 7, "local 7, 8 GPUs -> 7");
    CHECK(pln_engine_pick_device(-1, 8, 9) == 1, "local 9, 8 GPUs -> 1");
    CHECK(pln_engine_pick_device(-1, 1, 3) == 0, "CUDA_VISIBLE_DEVICES per rank: --gpus-per-node 1 -> 0");
    CHECK(pln_engine_pick_device(-1, 3, 2) == 2, "local 2, 3 GPUs -> 2");

    /* Two nodes of 8 GPUs, 16 ranks packed by node (mpirun --map-by node would interleave them;
     * the local rank is what the launcher says either way): every (node, device) pair once. */
    int used[2][8] = {{0}};
    for (int r = 0; r < 16; r++) {
        int node = r / 8, local = r % 8;
        int d = pln_engine_pick_device(-1, 8, local);
        CHECK(d >= 0 && d < 8, "rank %d -> device %d", r, d);
        if (d >= 0 && d < 8) used[node][d]++;
    }
    for (int n = 0; n < 2; n++)
        for (int d = 0; d < 8; d++) CHECK(used[n][d] == 1, "node %d device %d used %d times", n, d, used[n][d]);
    /* Four ranks on a node with two GPUs (a CPU-heavy test layout): two ranks per GPU. */
    int per[2] = {0, 0};
    for (int l = 0; l < 4; l++) per[pln_engine_pick_device(-1, 2, l)]++;
    CHECK(per[0] == 2 && per[1] == 2, "4 ranks on 2 GPUs: %d and %d", per[0], per[1]);

    /* Wrong values: refused with the field named, never a device. */
    pln_errorf("none");
    CHECK(pln_engine_pick_device(-1, -1, 0) == -1 && err_has("gpus_per_node", "-1"), "gpus_per_node -1: %s", pln_error());
    CHECK(pln_engine_pick_device(-1, -8, 3) == -1 && err_has("gpus_per_node", ">= 1"), "gpus_per_node -8: %s", pln_error());
    CHECK(pln_engine_pick_device(-5, 0, 0) == -1 && err_has("device", "-5"), "device -5: %s", pln_error());
    CHECK(pln_engine_pick_device(-2, 4, 1) == -1 && err_has("device", "-2"), "device -2: %s", pln_error());
    CHECK(pln_engine_pick_device(-1, 0, -1) == -1 && err_has("local_rank", NULL), "local rank -1: %s", pln_error());
    /* A bad --gpus-per-node is refused even with an explicit device: a typo should not hide. */
    CHECK(pln_engine_pick_device(2, -1, 0) == -1, "device 2 with gpus_per_node -1");

    /* The engine options default to "unset" for both. */
    pln_engine_opts o;
    pln_engine_opts_default(&o);
    CHECK(o.device == -1 && o.gpus_per_node == 0, "defaults: device %d gpus_per_node %d", o.device, o.gpus_per_node);
}

static void test_parse_int(void) {
    int64_t v = -99;
    CHECK(pln_cli_parse_int("--top-k", "42", 0, 100, &v) == 0 && v == 42, "42 -> %lld", (long long)v);
    CHECK(pln_cli_parse_int("--x", "-7", -10, 10, &v) == 0 && v == -7, "-7 -> %lld", (long long)v);
    CHECK(pln_cli_parse_int("--x", "0", 0, 0, &v) == 0 && v == 0, "0 in [0, 0]");
    CHECK(pln_cli_parse_int("--x", "16777216", 1, 1 << 24, &v) == 0 && v == 16777216, "upper bound inclusive");
    CHECK(pln_cli_parse_int("--seed", "9223372036854775807", 0, INT64_MAX, &v) == 0 && v == INT64_MAX, "INT64_MAX");

    v = 5;
    const char *bad[] = {"abc", "", "12abc", " 3", "3 ", "0x10", "1.5", "--", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = pln_cli_parse_int("--max-new-tokens", bad[i], 1, 100, &v);
        CHECK(rc == -1 && err_has("--max-new-tokens", "not an integer") && err_has(bad[i], "[1, 100]"),
              "\"%s\": rc %d, %s", bad[i], rc, pln_error());
    }
    CHECK(v == 5, "a refused value leaves the output alone (%lld)", (long long)v);
    CHECK(pln_cli_parse_int("--max-new-tokens", "0", 1, 100, &v) == -1 && err_has("--max-new-tokens 0", "out of range"),
          "0 below 1: %s", pln_error());
    CHECK(pln_cli_parse_int("--gpus-per-node", "0", 1, 1024, &v) == -1 && err_has("--gpus-per-node 0", "[1, 1024]"),
          "gpus-per-node 0: %s", pln_error());
    CHECK(pln_cli_parse_int("--device", "-5", 0, 1023, &v) == -1 && err_has("--device -5", "out of range"),
          "device -5: %s", pln_error());
    CHECK(pln_cli_parse_int("--x", "101", 1, 100, &v) == -1, "101 above 100");
}

static void test_parse_float(void) {
    double v = -1;
    CHECK(pln_cli_parse_float("--top-p", "0.9", 0, false, 1, &v) == 0 && v == 0.9, "0.9 -> %g", v);
    CHECK(pln_cli_parse_float("--top-p", "1", 0, false, 1, &v) == 0 && v == 1.0, "top_p 1 is allowed");
    CHECK(pln_cli_parse_float("--temperature", "0", 0, true, INFINITY, &v) == 0 && v == 0.0, "temperature 0 (greedy)");
    CHECK(pln_cli_parse_float("--temperature", "1e-3", 0, true, INFINITY, &v) == 0 && v == 1e-3, "1e-3 -> %g", v);
    CHECK(pln_cli_parse_float("--repetition-penalty", "1.2", 0, false, INFINITY, &v) == 0 && v == 1.2, "1.2 -> %g", v);
    CHECK(pln_cli_parse_float("--x", "-2.5", -3, true, 3, &v) == 0 && v == -2.5, "-2.5 -> %g", v);

    v = 7;
    CHECK(pln_cli_parse_float("--top-p", "0", 0, false, 1, &v) == -1 && err_has("--top-p 0", "(0, 1]"),
          "top_p 0: %s", pln_error());
    CHECK(pln_cli_parse_float("--top-p", "1.5", 0, false, 1, &v) == -1 && err_has("--top-p 1.5", "out of range"),
          "top_p 1.5: %s", pln_error());
    CHECK(pln_cli_parse_float("--temperature", "-1", 0, true, INFINITY, &v) == -1 && err_has("--temperature -1", "[0, inf)"),
          "temperature -1: %s", pln_error());
    CHECK(pln_cli_parse_float("--repetition-penalty", "0", 0, false, INFINITY, &v) == -1 &&
          err_has("--repetition-penalty 0", "(0, inf)"), "penalty 0: %s", pln_error());
    const char *bad[] = {"abc", "", "nan", "inf", "-inf", "1.5x", " 1", "1,5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = pln_cli_parse_float("--temperature", bad[i], 0, true, INFINITY, &v);
        CHECK(rc == -1 && err_has("--temperature", "not a finite number") && err_has(bad[i], NULL),
              "\"%s\": rc %d, %s", bad[i], rc, pln_error());
    }
    CHECK(pln_cli_parse_float("--temperature", "1e39", 0, true, INFINITY, &v) == -1 && err_has("1e39", "too large"),
          "1e39 overflows a float: %s", pln_error());
    CHECK(v == 7, "a refused value leaves the output alone (%g)", v);
    CHECK(pln_cli_parse_float("--x", "3.4e38", 0, true, INFINITY, &v) == 0 && v <= FLT_MAX, "3.4e38 fits a float");
}

int main(void) {
    test_begin("test_cli");
    test_pick_device();
    test_parse_int();
    test_parse_float();
    return test_done();
}
