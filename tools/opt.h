/* opt.h — the option parser every pollen command uses: one table per command drives the parsing
 * of argv, the environment variables (serve), the error messages and the --help text, so help and
 * parser cannot drift apart.
 *
 * Spellings: `--name VALUE` and `--name=VALUE` for every option, `-x VALUE` and `-xVALUE` for one
 * with a short letter (flags cluster: `-qj`), `--` ends the options (what follows is positional
 * even when it starts with a dash). A value is taken whatever it looks like (`--seed -1`,
 * `--prompt --json` gives the prompt "--json"), as getopt does.
 *
 * Errors, one wording for every command, printed once under mpirun (the rank read from the
 * environment: options are parsed before MPI starts) and answered with exit status 2:
 *   pollen generate: unknown option --max-new-token (did you mean --max-new-tokens?)
 *   see pollen generate --help
 *   pollen reshard: missing required option --tp (see pollen reshard --help)
 *   pollen generate: --prompt needs a value
 * A bad value keeps the message of tools/cli.c ("pollen: --top-p 2: out of range ..."). */
#ifndef PLN_OPT_H
#define PLN_OPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    PLN_OPT_FLAG,    /* bool: set by the option; from the environment 1/true/yes/on or 0/false/no/off */
    PLN_OPT_STR,     /* const char *: the last one given wins */
    PLN_OPT_INT,     /* any integer type (dst_size 1, 2, 4 or 8) in [ilo, ihi] (pln_cli_parse_int) */
    PLN_OPT_FLOAT,   /* float or double in flo..fhi, flo itself only when lo_incl (pln_cli_parse_float) */
    PLN_OPT_ENUM,    /* const char *: one of `choices` ("a|b|c") */
    PLN_OPT_LIST,    /* pln_opt_list: every value given, in order (repeatable) */
    PLN_OPT_FN,      /* fn(option, value, dst): 0, or -1 with pln_errorf's message */
    PLN_OPT_POS,     /* a positional argument (const char *), named by `name` ("SET") */
} pln_opt_kind;

/* The values of a repeatable option; `v` is owned by the parser (pln_opt_free). */
typedef struct {
    const char **v;
    int n;
} pln_opt_list;

enum {
    PLN_OPT_REQUIRED = 1u << 0,   /* missing: "missing required option --x" / "missing SET" */
    PLN_OPT_HIDDEN = 1u << 1,     /* accepted, never shown in help (test-only flags); no env variable */
    PLN_OPT_NOENV = 1u << 2,      /* no environment variable even where the command has a prefix */
};

typedef struct pln_opt {
    const char *name;       /* long name without "--"; for PLN_OPT_POS the metavar ("SET") */
    char short_name;        /* 0: none */
    const char *aliases;    /* other long names, comma-separated ("hostname,bind"), or NULL */
    pln_opt_kind kind;
    void *dst;
    size_t dst_size;
    const char *metavar;    /* the value's name in help ("N", "TEXT"); ENUM: its choices */
    const char *help;       /* the description; "{}" is replaced by the default (dst's value before parsing) */
    int64_t ilo, ihi;
    double flo, fhi;
    bool lo_incl;
    const char *choices;
    int (*fn)(const char *opt, const char *val, void *dst);
    unsigned flags;
    const char *env;        /* its environment variable; NULL: generated from the command's env_prefix */
    /* set by the parser */
    int given;              /* times given on the command line (1 when taken from the environment) */
    bool from_env;
    char *def;              /* the default as text, for help ("{}") */
    char *env_name;         /* the environment variable it reads, or NULL */
    char spelled[64];       /* how it was last given ("--num-shard", "-n", "POLLEN_PORT"), for messages */
} pln_opt;

/* A command: its name, the synopsis lines after "usage: " (several separated by '\n', each
 * continuation printed under the first), text printed between the synopsis and the options and
 * after them (may be NULL), the option table (ended by an entry with name NULL) and, where every
 * option has an environment variable, their prefix ("POLLEN_": --kv-tokens reads POLLEN_KV_TOKENS).
 * out/err NULL: stdout/stderr. rank: who prints (only 0 does); pln_opt_env_rank() by default. */
typedef struct {
    const char *cmd;
    const char *synopsis;
    const char *intro;
    const char *epilog;
    pln_opt *opts;
    const char *env_prefix;
    FILE *out, *err;
    int rank;
} pln_opt_cmd;

/* One table line per option; trailing arguments set more fields (.aliases = "...", .flags = ...). */
#define PLN_O_FLAG(n, s, var, h, ...) \
    {.name = (n), .short_name = (s), .kind = PLN_OPT_FLAG, .dst = &(var), .dst_size = sizeof(var), .help = (h), __VA_ARGS__}
#define PLN_O_STR(n, s, var, mv, h, ...) \
    {.name = (n), .short_name = (s), .kind = PLN_OPT_STR, .dst = &(var), .dst_size = sizeof(var), .metavar = (mv), .help = (h), __VA_ARGS__}
#define PLN_O_INT(n, s, var, lo, hi, mv, h, ...) \
    {.name = (n), .short_name = (s), .kind = PLN_OPT_INT, .dst = &(var), .dst_size = sizeof(var), .ilo = (lo), .ihi = (hi), \
     .metavar = (mv), .help = (h), __VA_ARGS__}
#define PLN_O_FLOAT(n, s, var, lo, incl, hi, mv, h, ...) \
    {.name = (n), .short_name = (s), .kind = PLN_OPT_FLOAT, .dst = &(var), .dst_size = sizeof(var), .flo = (lo), .lo_incl = (incl), \
     .fhi = (hi), .metavar = (mv), .help = (h), __VA_ARGS__}
#define PLN_O_ENUM(n, s, var, ch, h, ...) \
    {.name = (n), .short_name = (s), .kind = PLN_OPT_ENUM, .dst = &(var), .dst_size = sizeof(var), .choices = (ch), .metavar = (ch), \
     .help = (h), __VA_ARGS__}
#define PLN_O_LIST(n, s, var, mv, h, ...) \
    {.name = (n), .short_name = (s), .kind = PLN_OPT_LIST, .dst = &(var), .dst_size = sizeof(var), .metavar = (mv), .help = (h), __VA_ARGS__}
#define PLN_O_FN(n, s, f, var, mv, h, ...) \
    {.name = (n), .short_name = (s), .kind = PLN_OPT_FN, .fn = (f), .dst = &(var), .dst_size = sizeof(var), .metavar = (mv), .help = (h), __VA_ARGS__}
#define PLN_O_POS(mv, var, h, ...) \
    {.name = (mv), .kind = PLN_OPT_POS, .dst = &(var), .dst_size = sizeof(var), .help = (h), __VA_ARGS__}
#define PLN_O_END {.name = NULL}

#define PLN_OPT_HELP 1

/* Parses argv (argv[0] is the command's name) into the table's destinations, then fills the
 * options not given from their environment variables. Returns 0; PLN_OPT_HELP after printing
 * the help on out (-h/--help anywhere before `--`: help wins over every other error); -1 after
 * printing one error on err. Positionals fill the PLN_OPT_POS entries in order; an option whose
 * dst is a positional's (`-m SET`) fills it instead. */
int pln_opt_parse(pln_opt_cmd *c, int argc, char **argv);
/* The same, then: PLN_OPT_HELP exits 0, an error exits 2. */
void pln_opt_parse_or_exit(pln_opt_cmd *c, int argc, char **argv);
/* Frees what the parser allocated (lists, defaults, env names). Never fails. */
void pln_opt_free(pln_opt_cmd *c);

/* The entry named `name` (long name without "--"), or NULL. */
pln_opt *pln_opt_find(pln_opt_cmd *c, const char *name);
/* Whether the option was given on the command line or through its environment variable. */
bool pln_opt_given(pln_opt_cmd *c, const char *name);

/* Prints the command's help, generated from its table, on f. Never fails. */
void pln_opt_help(pln_opt_cmd *c, FILE *f);
/* Prints "pollen CMD: MESSAGE (see pollen CMD --help)" on err when this rank prints, returns 2
 * (the usage exit status) for the caller to return. */
int pln_opt_usage_error(const pln_opt_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This process's MPI rank as the launcher's environment gives it (OMPI_COMM_WORLD_RANK,
 * PMIX_RANK, PMI_RANK), 0 outside mpirun: usage errors come before MPI starts. */
int pln_opt_env_rank(void);

/* Edit distance between a and b, a swap of two neighbours counting one (for "did you mean"). */
int pln_opt_edit_distance(const char *a, const char *b);

#endif
