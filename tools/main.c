/* main.c — the `pollen` command line: dispatches to one file per subcommand (tools/cmd_*.c). */
#include "formats/common.h"
#include "tools/cmd.h"
#include "tools/launch.h"
#include "tools/opt.h"

#include <stdio.h>
#include <string.h>

/* Weak so the binary links while a subcommand's file is absent from a partial build; a missing
 * one says so instead of crashing. */
#define CMD(name) int cmd_##name(int argc, char **argv) __attribute__((weak));
PLN_COMMANDS(CMD)
#undef CMD

static const struct { const char *name; int (*fn)(int, char **); const char *help; } g_cmds[] = {
    {"inspect", cmd_inspect, "show the config and tensors of a checkpoint or shard set"},
    {"reshard", cmd_reshard, "convert a Hugging Face checkpoint (BLOOM, Llama, Mistral, Qwen2) into TP shards (fp16/int8/int4)"},
    {"verify", cmd_verify, "check a shard set's checksums, and against its source with --source"},
    {"synth", cmd_synth, "write a random checkpoint of a real model's shape (BLOOM or Llama family; tests, benchmarks)"},
    {"generate", cmd_generate, "generate text from a shard set (a TP-N set starts its N ranks under mpirun)"},
    {"serve", cmd_serve, "serve a shard set over HTTP (TGI and OpenAI routes)"},
    {"bench", cmd_bench, "measure prefill and decode speed on a shard set"},
    {"perplexity", cmd_perplexity, "perplexity of a shard set on a text, and KL / top-1 agreement against a base set"},
    {"tokenize", cmd_tokenize, "encode a text (or --decode ids) with a model's own tokenizer.json, as HF tokenizers"},
    {"template", cmd_template, "print the prompt a model's chat template makes of a conversation"},
};

static void usage(FILE *f) {
    fprintf(f, "pollen %s — tensor-parallel shards and serving for BLOOM and the Llama family\n\nusage: pollen COMMAND [options]\n\ncommands:\n",
            PLN_VERSION_STRING);
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", g_cmds[i].name, g_cmds[i].help);
    fprintf(f, "\n`pollen COMMAND --help` shows a command's options.\n");
}

int main(int argc, char **argv) {
    pln_launch_rank_started();
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("pollen %s\n", PLN_VERSION_STRING); return 0; }
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++) {
        if (strcmp(argv[1], g_cmds[i].name)) continue;
        if (!g_cmds[i].fn) pln_die("'%s' is not part of this build", argv[1]);
        /* SIGINT/SIGTERM end any command at any phase, with a word on why (serve drains instead
         * and installs its own; reshard and synth add the removal of their temporary output). */
        if (strcmp(argv[1], "serve")) pln_exit_on_signal(argv[1]);
        return g_cmds[i].fn(argc - 1, argv + 1);
    }
    /* a typo of a command gets the same suggestion as a typo of an option */
    const char *best = NULL;
    int best_d = 3;
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++) {
        int d = pln_opt_edit_distance(argv[1], g_cmds[i].name);
        if (d < best_d && (size_t)d * 3 <= strlen(argv[1])) { best_d = d; best = g_cmds[i].name; }
    }
    if (best) {
        fprintf(stderr, "pollen: unknown command '%s' (did you mean %s?)\nsee pollen --help\n", argv[1], best);
        return 2;
    }
    /* nothing close: name the commands in one line, as an unknown option is (no usage dump) */
    fprintf(stderr, "pollen: unknown command '%s' (commands:", argv[1]);
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++) fprintf(stderr, " %s", g_cmds[i].name);
    fprintf(stderr, ")\nsee pollen --help\n");
    return 2;
}
