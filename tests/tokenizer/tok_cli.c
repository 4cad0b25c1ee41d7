/* tok_cli.c - runs the `glm tokenize` subcommand on its own: tok_cli tokenize ARGS...
 * (stands in for ./glm until the main program dispatches to tokenize_main). */
#include "../../tokenizer.h"

int main(int argc, char **argv) { return argc < 2 ? 1 : tokenize_main(argc - 1, argv + 1); }
