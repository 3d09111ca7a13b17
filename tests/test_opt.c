/* test_opt.c — the option parser every command uses (tools/opt.c): both long spellings, short
 * options and clusters, `--`, repeated and repeatable options, values that look like options,
 * aliases, environment variables, the one-line errors (unknown option with its suggestion, missing
 * value, missing required option, a flag given a value) and the generated help. */
#include "test.h"

#include "formats/common.h"
/* The parser lives with the command line (tools/ is not in the library); test it in place. */
#include "tools/cli.c"
#include "tools/opt.c"

#include <float.h>

/* One table: a command with every kind of option. */
typedef struct {
    const char *set, *name, *mode;
    pln_opt_list items;
    int64_t seed;
    int32_t port;
    float temp;
    double to;
    bool quiet, json, secret;
} vals;

static pln_opt *table(vals *v) {
    static pln_opt o[16];
    pln_opt t[] = {
        PLN_O_POS("SET", v->set, "the set", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("model", 'm', v->set, "SET", "the set again"),
        PLN_O_STR("name", 0, v->name, "NAME", "a name (default {})", .aliases = "display-name,nick"),
        PLN_O_ENUM("mode", 0, v->mode, "fast|slow|off", "the mode (default {})"),
        PLN_O_LIST("item", 'i', v->items, "X", "repeatable"),
        PLN_O_INT("seed", 's', v->seed, -10, 10, "S", "seed (default {})"),
        PLN_O_INT("port", 'p', v->port, 0, 65535, "N", "port (default {})", .aliases = "listen-port"),
        PLN_O_FLOAT("temperature", 0, v->temp, 0, false, 2, "T", "temperature in (0, 2]"),
        PLN_O_FN("step-timeout", 0, pln_cli_parse_step_timeout, v->to, "S|auto|off", "watchdog"),
        PLN_O_FLAG("quiet", 'q', v->quiet, "quiet"),
        PLN_O_FLAG("json", 'j', v->json, "json"),
        PLN_O_FLAG("secret-test-flag", 0, v->secret, "test only", .flags = PLN_OPT_HIDDEN),
        PLN_O_END,
    };
    memcpy(o, t, sizeof t);
    return o;
}

/* Runs the parser over a NULL-terminated argv; the values in *v, stdout/stderr in out/err. */
static char g_out[8192], g_err[8192];
static int run_env(vals *v, const char *prefix, int rank, const char **args) {
    memset(v, 0, sizeof *v);
    v->name = "dflt";
    v->mode = "fast";
    v->port = 8080;
    static char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"demo";
    for (; args[argc - 1]; argc++) argv[argc] = (char *)args[argc - 1];
    g_out[0] = g_err[0] = 0;
    FILE *out = fmemopen(g_out, sizeof g_out, "w"), *err = fmemopen(g_err, sizeof g_err, "w");
    pln_opt_cmd c = {.cmd = "demo", .synopsis = "pollen demo SET [options]", .opts = table(v), .env_prefix = prefix,
                     .out = out, .err = err, .rank = rank};
    int rc = pln_opt_parse(&c, argc, argv);
    fclose(out);
    fclose(err);
    /* free what the parser allocated, but keep the list's values for the checks */
    pln_opt_list keep = v->items;
    v->items.v = NULL;
    pln_opt_free(&c);
    if (keep.v) {
        static const char *copy[16];
        for (int i = 0; i < keep.n && i < 16; i++) copy[i] = keep.v[i];
        free(keep.v);
        v->items.v = copy;
        v->items.n = keep.n;
    }
    return rc;
}
#define RUN(v, ...) run_env((v), NULL, 0, (const char *[]){__VA_ARGS__, NULL})
#define ERR_HAS(s) (strstr(g_err, (s)) != NULL)

static void test_spellings(void) {
    vals v;
    CHECK(RUN(&v, "S", "--seed", "3") == 0 && v.seed == 3, "--seed 3");
    CHECK(RUN(&v, "S", "--seed=4") == 0 && v.seed == 4, "--seed=4");
    CHECK(RUN(&v, "S", "-s", "5") == 0 && v.seed == 5, "-s 5");
    CHECK(RUN(&v, "S", "-s6") == 0 && v.seed == 6, "-s6");
    CHECK(RUN(&v, "S", "--seed", "-1") == 0 && v.seed == -1, "a negative value after its option: %lld", (long long)v.seed);
    CHECK(RUN(&v, "S", "-s-2") == 0 && v.seed == -2, "-s-2");
    CHECK(RUN(&v, "S", "--port=0") == 0 && v.port == 0, "an int32 destination");
    CHECK(RUN(&v, "S", "-qj") == 0 && v.quiet && v.json, "a cluster of flags");
    CHECK(RUN(&v, "S", "-qs7") == 0 && v.quiet && v.seed == 7, "flags then a short option with its value");
    CHECK(RUN(&v, "--quiet", "S") == 0 && v.quiet && !strcmp(v.set, "S"), "options before the positional");
    CHECK(RUN(&v, "S", "--name=") == 0 && !strcmp(v.name, ""), "--name= is the empty value");
    CHECK(RUN(&v, "S", "--name", "--json") == 0 && !strcmp(v.name, "--json") && !v.json,
          "a value is taken whatever it looks like");
    CHECK(RUN(&v, "S", "--name=a=b") == 0 && !strcmp(v.name, "a=b"), "only the first = splits");
    CHECK(RUN(&v, "S", "--name", "héllo wörld ✓") == 0 && !strcmp(v.name, "héllo wörld ✓"), "a UTF-8 value");
    CHECK(RUN(&v, "S", "--name", "a", "--name", "b") == 0 && !strcmp(v.name, "b"), "the last one wins");
    CHECK(RUN(&v, "S", "-i", "a", "--item=b", "--item", "c") == 0 && v.items.n == 3 && !strcmp(v.items.v[0], "a") &&
              !strcmp(v.items.v[2], "c"), "a repeatable option keeps every value in order (%d)", v.items.n);
    CHECK(RUN(&v, "S", "--temperature", "0.5") == 0 && v.temp == 0.5f, "a float destination");
    CHECK(RUN(&v, "S", "--step-timeout", "off") == 0 && v.to == -1, "a parsing function");
    CHECK(RUN(&v, "S", "--mode", "slow") == 0 && !strcmp(v.mode, "slow"), "an enum");
    CHECK(RUN(&v, "S", "--secret-test-flag") == 0 && v.secret, "a hidden option is accepted");
}

static void test_aliases_and_positionals(void) {
    vals v;
    CHECK(RUN(&v, "S", "--display-name", "x") == 0 && !strcmp(v.name, "x"), "an alias");
    CHECK(RUN(&v, "S", "--nick=y") == 0 && !strcmp(v.name, "y"), "a second alias with =");
    CHECK(RUN(&v, "S", "--listen-port", "9") == 0 && v.port == 9, "an alias of an int");
    CHECK(RUN(&v, "-m", "M") == 0 && !strcmp(v.set, "M"), "-m fills the positional");
    CHECK(RUN(&v, "--", "--json") == 0 && !strcmp(v.set, "--json") && !v.json, "-- ends the options");
    CHECK(RUN(&v, "-q", "--", "-x") == 0 && v.quiet && !strcmp(v.set, "-x"), "a dash positional after --");
    CHECK(RUN(&v, "-") == 0 && !strcmp(v.set, "-"), "- alone is a positional");
    CHECK(RUN(&v, "A", "B") == -1 && ERR_HAS("pollen demo: unexpected argument B (see pollen demo --help)"), "two: %s", g_err);
    CHECK(RUN(&v, "A", "-m", "B") == -1 && ERR_HAS("SET given twice (A and B)"), "SET and -m: %s", g_err);
    CHECK(RUN(&v, "-m", "A", "B") == -1 && ERR_HAS("SET given twice (A and B)"), "-m and SET: %s", g_err);
    CHECK(RUN(&v, "--quiet") == -1 && !strcmp(g_err, "pollen demo: missing SET (see pollen demo --help)\n"),
          "a missing positional is named: %s", g_err);
}

static void test_errors(void) {
    vals v;
    CHECK(RUN(&v, "S", "--sede", "3") == -1 &&
              !strcmp(g_err, "pollen demo: unknown option --sede (did you mean --seed?)\nsee pollen demo --help\n"),
          "a typo gets a suggestion: %s", g_err);
    CHECK(RUN(&v, "S", "--listen-prot=3") == -1 && ERR_HAS("unknown option --listen-prot (did you mean --listen-port?)"),
          "an alias is suggested, the =value is not echoed: %s", g_err);
    CHECK(RUN(&v, "S", "--frobnicate") == -1 && ERR_HAS("unknown option --frobnicate\n") && !ERR_HAS("did you mean"),
          "no suggestion when nothing is close: %s", g_err);
    CHECK(RUN(&v, "S", "--secret-test-flg") == -1 && !ERR_HAS("did you mean"), "a hidden option is never suggested: %s", g_err);
    CHECK(RUN(&v, "S", "-z") == -1 && ERR_HAS("pollen demo: unknown option -z\nsee pollen demo --help"), "-z: %s", g_err);
    CHECK(RUN(&v, "S", "--ünïcode") == -1 && ERR_HAS("unknown option --ünïcode"), "a UTF-8 option name: %s", g_err);
    CHECK(RUN(&v, "S", "--seed") == -1 && !strcmp(g_err, "pollen demo: --seed needs a value\n"), "missing value: %s", g_err);
    CHECK(RUN(&v, "S", "-s") == -1 && !strcmp(g_err, "pollen demo: --seed needs a value\n"), "-s at the end: %s", g_err);
    CHECK(RUN(&v, "S", "--quiet=yes") == -1 && ERR_HAS("--quiet takes no value"), "a flag given a value: %s", g_err);
    CHECK(RUN(&v, "S", "--seed", "11") == -1 && ERR_HAS("pollen: --seed 11: out of range (expected an integer in [-10, 10])"),
          "the range message of tools/cli.c: %s", g_err);
    CHECK(RUN(&v, "S", "--seed=") == -1 && ERR_HAS("--seed \"\": not an integer"), "--seed= is not an integer: %s", g_err);
    CHECK(RUN(&v, "S", "-s", "1x") == -1 && ERR_HAS("-s \"1x\": not an integer"), "the short name as written: %s", g_err);
    CHECK(RUN(&v, "S", "--temperature", "0") == -1 && ERR_HAS("(0, 2]"), "an open lower bound: %s", g_err);
    CHECK(RUN(&v, "S", "--mode", "medium") == -1 && ERR_HAS("--mode \"medium\": expected fast, slow or off"),
          "an enum names its choices: %s", g_err);
    CHECK(RUN(&v, "S", "--step-timeout", "x") == -1 && ERR_HAS("\"auto\""), "the function's message: %s", g_err);
    /* the first error wins; only rank 0 prints, every rank fails */
    CHECK(run_env(&v, NULL, 1, (const char *[]){"S", "--bogus", NULL}) == -1 && g_err[0] == 0, "rank 1 prints nothing");
    CHECK(run_env(&v, NULL, 1, (const char *[]){NULL}) == -1 && g_err[0] == 0, "rank 1: missing SET, silently");
}

static void test_help(void) {
    vals v;
    CHECK(RUN(&v, "S", "--bogus", "--help") == PLN_OPT_HELP && g_err[0] == 0, "--help wins over an error");
    CHECK(RUN(&v, "-h") == PLN_OPT_HELP, "-h, with the required SET missing");
    CHECK(RUN(&v, "--", "--help") == 0 && !strcmp(v.set, "--help"), "--help after -- is a positional");
    CHECK(RUN(&v, "S", "--name", "--help") == 0 && !strcmp(v.name, "--help"), "--help as a value is a value");
    RUN(&v, "--help");
    CHECK(!strncmp(g_out, "usage: pollen demo SET [options]\n", 33), "the synopsis first: %s", g_out);
    CHECK(strstr(g_out, "\n  -s, --seed S ") && strstr(g_out, "seed (default 0)"), "short and long, the default: %s", g_out);
    CHECK(strstr(g_out, "\n  --name NAME ") && strstr(g_out, "a name (default dflt) (also --display-name, --nick)"),
          "the aliases are listed: %s", g_out);
    CHECK(strstr(g_out, "--port N") && strstr(g_out, "port (default 8080)"), "an int default");
    CHECK(strstr(g_out, "--mode fast|slow|off") && strstr(g_out, "(default fast)"), "an enum shows its choices");
    CHECK(!strstr(g_out, "secret"), "a hidden option is not shown");
    CHECK(strstr(g_out, "  -h, --help"), "--help itself");
    /* the descriptions start in one column */
    const char *a = strstr(g_out, "  -s, --seed S"), *b = strstr(g_out, "  --temperature T");
    CHECK(a && b && strstr(a, "seed (") - a == strstr(b, "temperature in") - b, "one description column: %s", g_out);
    CHECK(!strstr(g_out, "POLLEN_"), "no environment section without a prefix");
    run_env(&v, "DEMO_", 0, (const char *[]){"--help", NULL});
    CHECK(strstr(g_out, "DEMO_SEED") && strstr(g_out, "DEMO_STEP_TIMEOUT") && !strstr(g_out, "DEMO_SECRET"),
          "the environment variables are listed, not the hidden option's: %s", g_out);
}

static void test_env(void) {
    vals v;
    setenv("DEMO_SEED", "4", 1);
    setenv("DEMO_NAME", "from-env", 1);
    setenv("DEMO_QUIET", "yes", 1);
    setenv("DEMO_JSON", "0", 1);
    CHECK(run_env(&v, "DEMO_", 0, (const char *[]){"S", NULL}) == 0 && v.seed == 4 && !strcmp(v.name, "from-env") &&
              v.quiet && !v.json, "values from the environment");
    CHECK(run_env(&v, "DEMO_", 0, (const char *[]){"S", "--seed", "2", "--display-name", "argv", NULL}) == 0 &&
              v.seed == 2 && !strcmp(v.name, "argv"), "argv (and an alias on it) wins over the environment");
    CHECK(run_env(&v, NULL, 0, (const char *[]){"S", NULL}) == 0 && v.seed == 0, "no prefix: the environment is not read");
    setenv("DEMO_SEED", "99", 1);
    CHECK(run_env(&v, "DEMO_", 0, (const char *[]){"S", NULL}) == -1 &&
              ERR_HAS("pollen: DEMO_SEED: --seed 99: out of range"), "a bad value names the variable: %s", g_err);
    setenv("DEMO_SEED", "1", 1);
    setenv("DEMO_QUIET", "maybe", 1);
    CHECK(run_env(&v, "DEMO_", 0, (const char *[]){"S", NULL}) == -1 && ERR_HAS("DEMO_QUIET=maybe") &&
              ERR_HAS("1/true/yes/on or 0/false/no/off"), "a flag's variable: %s", g_err);
    unsetenv("DEMO_QUIET");
    setenv("DEMO_MODEL", "ENVSET", 1);
    CHECK(run_env(&v, "DEMO_", 0, (const char *[]){NULL}) == 0 && !strcmp(v.set, "ENVSET"), "the set from the environment");
    CHECK(run_env(&v, "DEMO_", 0, (const char *[]){"ARGSET", NULL}) == 0 && !strcmp(v.set, "ARGSET"),
          "a positional SET wins over its option's variable");
    setenv("DEMO_SECRET_TEST_FLAG", "1", 1);
    CHECK(run_env(&v, "DEMO_", 0, (const char *[]){"S", NULL}) == 0 && !v.secret, "a hidden option has no variable");
    unsetenv("DEMO_SEED"); unsetenv("DEMO_NAME"); unsetenv("DEMO_JSON"); unsetenv("DEMO_MODEL"); unsetenv("DEMO_SECRET_TEST_FLAG");
}

static void test_misc(void) {
    CHECK(pln_opt_edit_distance("max-new-token", "max-new-tokens") == 1, "one insertion");
    CHECK(pln_opt_edit_distance("", "abc") == 3 && pln_opt_edit_distance("abc", "") == 3, "to and from empty");
    CHECK(pln_opt_edit_distance("kitten", "sitting") == 3, "kitten/sitting");
    CHECK(pln_opt_edit_distance("sede", "seed") == 1, "a transposition is one edit");
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    CHECK(pln_opt_env_rank() == 3, "the launcher's rank");
    unsetenv("OMPI_COMM_WORLD_RANK");
    setenv("PMI_RANK", "2", 1);
    CHECK(pln_opt_env_rank() == 2, "PMI_RANK");
    unsetenv("PMI_RANK");
    unsetenv("PMIX_RANK");
    CHECK(pln_opt_env_rank() == 0, "outside mpirun: 0");
}

int main(void) {
    test_begin("test_opt");
    unsetenv("OMPI_COMM_WORLD_RANK");
    test_spellings();
    test_aliases_and_positionals();
    test_errors();
    test_help();
    test_env();
    test_misc();
    return test_done();
}
