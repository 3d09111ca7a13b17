/* cmd.h — the subcommands. Each lives in tools/cmd_<name>.c and gets argv with argv[0] = name.
 * Returns the process exit status (0 ok, 1 failure, 2 usage). */
#ifndef PLN_CMD_H
#define PLN_CMD_H
#define PLN_COMMANDS(X) X(inspect) X(reshard) X(verify) X(synth) X(generate) X(serve) X(bench) X(perplexity) X(tokenize) X(template)
#define PLN_CMD_DECL(name) int cmd_##name(int argc, char **argv);
PLN_COMMANDS(PLN_CMD_DECL)
#undef PLN_CMD_DECL
#endif
