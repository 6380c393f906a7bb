/* cmd_client: `mlaserve client`, a command-line gRPC client (common/apiclient.h, docs/grpc.md).
 *   mlaserve client [--host H] --port P [--api-key K] [--timeout S] [--tls [--tls-ca F]] COMMAND
 *   COMMAND: generate -p TEXT [--chat] [-n N] [--temp T] [--top-p P] [--top-k K] [--seed S]
 *                     [--stop STR]... [--ignore-eos] [--logprobs N] [--stream] [--json]
 *            tokenize TEXT [--no-special]  |  health  |  models
 * generate prints the completion's text (--stream: each token's text as it arrives), then a
 * newline; --json prints one JSON object per token and a last one with finish_reason and usage
 * instead. tokenize prints the ids separated by spaces; health prints the status (exit 1 when
 * unhealthy); models prints one "id max_model_len" line per model ("id loading" while the
 * server's workers load: the context is not known yet). The API key may also come
 * from MLASERVE_API_KEY. argv[0] is "client". Returns the exit status (1 on errors, 2 on usage). */
#ifndef CMD_CLIENT_H
#define CMD_CLIENT_H

int cmd_client(int argc, char **argv);

#endif
