/* mlaserve bench: throughput of the serving stack (coordinator + N worker processes, started as
 * `mlaserve generate` starts them), driven by step plans sent directly (no HTTP, no tokenizer:
 * synthetic token ids from a fixed seed).
 *
 * For each tensor-parallel size in --tp (fresh workers each):
 *  - prefill: one sequence of P tokens; the time from sending the plan until its first token is
 *    back (time to first token: the last token's logits, greedy-sampled on the worker, as the
 *    server does); best and mean over --repeat runs.
 *  - decode at batch B and context C: B sequences made to hold C positions of (zero) latent cache
 *    without prefilling them (Bench FILL, engine bench_fill), then --warmup untimed and --steps
 *    timed steps of one new token per sequence (greedy on the worker, each sampled token fed
 *    back); per-step time, tokens/s in all and per sequence.
 *  - for TP > 1: the all-reduce cost of a decode step (Bench COLL, engine bench_coll: every rank
 *    times all-reduces of B * n_embd floats; a step does 2 per layer) and its share of the step.
 *  - scaling efficiency against TP 1 of the same run, and with --bw-gbs / --tflops the fraction of
 *    those per-rank limits: decode bytes touched per step per rank (from the GGUF tensors and the
 *    plan of rank 0) / bandwidth against the step time; prefill 2 * P * active parameters / time.
 * Output: a markdown table on stdout (and --md FILE), the same data as JSON (--json FILE). */
#ifndef CMD_BENCH_H
#define CMD_BENCH_H

/* argv[0] = "bench". Exit status 0, 1 (a failure; rows measured before it are still printed and
 * written), 2 (bad usage). */
int cmd_bench(int argc, char **argv);

#endif
