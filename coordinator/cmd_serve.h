/* cmd_serve: `mlaserve serve`, the OpenAI-compatible HTTP server over N worker processes.
 *   mlaserve serve -m MODEL.gguf [--tp N] [--threads N] [--host H] [--port P] [--api-key K]
 *                  [--model-name NAME] [--max-context N] [--default-max-tokens N] [--max-seqs N]
 *                  [--max-prefill-tokens N]
 *                  [--kv-blocks N] [--block-size N] [--max-queue N] [--max-body BYTES]
 *                  [--max-conns N] [--port-file F] [--worker-exe X] [--coord ENDPOINT]
 *                  [--proto-port P] [--proto-port-file F] [--tls-cert F --tls-key F]
 * --proto-port: the gRPC API (coordinator/grpc_server.h, docs/grpc.md) on the same host, same
 * API key; TLS on that port with --tls-cert/--tls-key.
 * Binds 127.0.0.1 by default; the API key may also come from MLASERVE_API_KEY. argv[0] is
 * "serve". Returns the process exit status (0 after SIGINT / SIGTERM). */
#ifndef CMD_SERVE_H
#define CMD_SERVE_H

int cmd_serve(int argc, char **argv);

#endif
