/* wire: coordinator <-> worker frames (proto/mla.proto) as plain C structs, with encoding,
 * decoding and validation. A frame is one protobuf Envelope (magic, version, kind, one body).
 *
 * wire_decode() never trusts its input: it rejects frames over the size limit, a wrong magic or
 * version, a kind that does not match the body, and every field out of range (counts, token ids,
 * positions, sequence ids, sampling parameters, strings), with a message naming the field.
 *
 * Ownership: wire_decode() fills a wire_msg whose arrays are heap copies owned by the message;
 * release them with wire_msg_free(). A wire_msg built by hand for wire_encode() points at the
 * caller's arrays (wire_encode only reads them; never wire_msg_free such a message).
 * wire_encode() returns a malloc'ed buffer the caller free()s. */
#ifndef WIRE_H
#define WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mla_err.h"

#define WIRE_MAGIC 0x574c4d41u /* "AMLW" little-endian */
#define WIRE_VERSION 6u /* 3: block tables in the plan, the cache pool, load progress, worker stats; 4: prompt logprobs;
                               * 5: min_tokens (an older worker would not hold the stop tokens back);
                               * 6: SeqPlan.last (an older worker would not read it) */
#define WIRE_MAX_FRAME ((size_t)256 << 20)
#define WIRE_MAX_SEQS 4096
#define WIRE_MAX_STEP_TOKENS (1u << 20)
#define WIRE_MAX_CTX (1u << 24)
#define WIRE_MAX_TOP_LOGPROBS 20
#define WIRE_MAX_WORLD 64
#define WIRE_MAX_STR 512
#define WIRE_MAX_NCCL_ID 128
#define WIRE_MAX_BENCH_FLOATS ((uint64_t)1 << 28) /* one all-reduce buffer of `mlaserve bench` (1 GiB) */
#define WIRE_MAX_BENCH_ITERS 1000000u
#define WIRE_MAX_BLOCKS (1u << 24) /* cache blocks of one pool */
#define WIRE_MAX_GRAMMAR (1u << 20) /* bytes of a grammar (common/gram.h GRAM_MAX_TEXT) */
#define WIRE_MAX_BIAS 300         /* logit biases of a sequence */
#define WIRE_MAX_BAN 256          /* stop tokens banned until min_tokens of a sequence */

typedef enum wire_kind {
    WIRE_REGISTER = 1,
    WIRE_REGISTER_REPLY = 2,
    WIRE_STEP_PLAN = 3,
    WIRE_STEP_RESULT = 4,
    WIRE_CONTROL = 5,
    WIRE_BENCH = 6,        /* coordinator -> every worker (`mlaserve bench`) */
    WIRE_BENCH_RESULT = 7, /* every worker -> coordinator, one per Bench */
} wire_kind;

typedef enum wire_logits_mode { WIRE_LOGITS_NONE = 0, WIRE_LOGITS_LAST = 1, WIRE_LOGITS_ALL = 2 } wire_logits_mode;

typedef enum wire_control_kind {
    WIRE_CTL_HEARTBEAT = 1,
    WIRE_CTL_SHUTDOWN = 2,
    WIRE_CTL_FREE_SEQ = 3,
    WIRE_CTL_LOAD = 4,
    WIRE_CTL_LOADED = 5,
    WIRE_CTL_ERROR = 6,
    WIRE_CTL_NCCL_ID = 7, /* rank 0 -> coordinator -> other ranks: nccl_id, exactly WIRE_MAX_NCCL_ID bytes */
    WIRE_CTL_LOAD_PROGRESS = 8, /* worker -> coordinator while loading: load_done of load_total bytes */
} wire_control_kind;

typedef struct wire_register {
    uint32_t rank, world;
    char host[WIRE_MAX_STR];
    char device[WIRE_MAX_STR];
    uint32_t protocol_version;
    uint64_t model_hash;
    int32_t pid;
} wire_register;

/* What a worker sizes its scratch and its latent cache pool by (RegisterReply; wire_decode
 * checks gpu_memory_utilization in (0, 1], max_step_tokens <= WIRE_MAX_STEP_TOKENS, max_context
 * <= WIRE_MAX_CTX, max_seqs <= WIRE_MAX_SEQS). */
typedef struct wire_kv_opts {
    float gpu_memory_utilization; /* CUDA: the fraction of the device's memory used in all */
    uint64_t kv_memory_bytes;     /* CPU: the pool's bytes; CUDA: a cap on them (0: none) */
    uint32_t max_step_tokens;     /* largest step (prefill chunk) */
    uint32_t max_context;         /* longest sequence (0: the model's context) */
    uint32_t max_seqs;            /* most sequences a step */
    bool local_group;             /* every rank was started on one host with the same devices visible:
                                   * ranks on one device split gpu_memory_utilization */
} wire_kv_opts;
/* The most tokens of a step that the workers size their scratch for, and so the most a step plan
 * may carry: a prefill chunk's max_step_tokens, or a decode step's max_seqs rows if larger. */
static inline uint32_t wire_kv_step_cap(const wire_kv_opts *o) {
    return o->max_step_tokens > o->max_seqs ? o->max_step_tokens : o->max_seqs;
}

/* Worker settings the coordinator's flags decide (RegisterReply; zeros: the defaults). */
enum { WIRE_AHEAD_QUEUE = 0, WIRE_AHEAD_OFF = 1, WIRE_AHEAD_SYNC = 2 };
enum { WIRE_NCCL_AUTO = 0, WIRE_NCCL_OFF = 1, WIRE_NCCL_REQUIRED = 2 };
enum { WIRE_PREC_SPLIT = 0, WIRE_PREC_BF16 = 1, WIRE_PREC_EXACT = 2 };
enum { WIRE_AR_NCCL = 0, WIRE_AR_ONESHOT = 1 };
typedef struct wire_worker_opts {
    uint32_t nccl_id_timeout_ms; /* 0: 120000 */
    int32_t spin_us;             /* < 0: the backend's default */
    uint32_t step_ahead;         /* WIRE_AHEAD_* */
    uint32_t nccl;               /* WIRE_NCCL_* */
    uint32_t cuda_precision;     /* WIRE_PREC_* */
    uint32_t allreduce;          /* WIRE_AR_* */
    uint32_t log_level;          /* 0: the worker's own; else 1 + enum mla_log_level */
} wire_worker_opts;

typedef struct wire_register_reply {
    bool ok;
    char reason[WIRE_MAX_STR];
    char coll_shm_name[WIRE_MAX_STR];
    uint8_t nccl_id[WIRE_MAX_NCCL_ID];
    uint32_t nccl_id_len;
    uint32_t heartbeat_ms, heartbeat_timeout_ms, coll_timeout_ms;
    wire_kv_opts kv; /* the cache pool the worker takes at load */
    wire_worker_opts wo;
} wire_register_reply;

/* Sampling parameters, normalised by wire_decode: top_p 0 -> 1, repetition_penalty 0 -> 1. */
typedef struct wire_sampling {
    float temperature; /* 0 = greedy */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty, frequency_penalty;
    uint32_t penalty_start; /* position of the first generated token: presence / frequency count from there */
    uint64_t seed;
    bool logprobs;
    uint32_t top_logprobs;
    wire_logits_mode logits;
    /* output constraints (proto/mla.proto SamplingParams): arrays owned by the decoded message */
    bool constrained, constraint_setup;
    char *grammar; /* NUL-terminated, NULL when none (at most WIRE_MAX_GRAMMAR bytes) */
    uint32_t grammar_start;
    uint32_t n_replay;
    int32_t *replay;
    uint32_t n_bias; /* <= WIRE_MAX_BIAS */
    int32_t *bias_ids;
    float *bias_vals;
    /* min_tokens: ban_ids (distinct, <= WIRE_MAX_BAN) are not sampled at positions before
     * grammar_start + min_tokens; set up with the constraint (constraint_setup) */
    uint32_t min_tokens;
    uint32_t n_ban;
    int32_t *ban_ids;
    /* with logits WIRE_LOGITS_ALL: rank 0 returns the logprobs of the row's next tokens
     * (wire_seq_result.plp) instead of its logits */
    bool prompt_logprobs;
} wire_sampling;

typedef struct wire_seq {
    uint64_t seq_id;
    uint32_t n_tokens;
    int32_t *tokens;
    int32_t *positions;
    bool sample;
    wire_sampling sp;
    /* block table update: the worker's table for the sequence is cut to block_start entries,
     * then blocks[0, n_blocks) are appended (wire_decode checks every id < max_blocks) */
    uint32_t block_start;
    uint32_t n_blocks;
    uint32_t *blocks;
    /* sp.prompt_logprobs: the token after tokens[n_tokens - 1] (-1: none, the row ends the prompt) */
    int32_t next_token;
    /* with sample: the token sampled is the request's last by its length (max_tokens, the context) */
    bool last;
} wire_seq;

typedef struct wire_step_plan {
    uint64_t step_id;
    uint32_t n_seqs;
    wire_seq *seqs;
} wire_step_plan;

typedef struct wire_top {
    int32_t token;
    float logprob;
} wire_top;

/* the logprob of a row's next token and the most likely alternatives (sp.prompt_logprobs) */
typedef struct wire_plp {
    float logprob;
    uint32_t n_top;
    wire_top top[WIRE_MAX_TOP_LOGPROBS];
} wire_plp;

typedef struct wire_seq_result {
    uint64_t seq_id;
    int32_t token; /* -1 when not sampled */
    float logprob;
    uint32_t n_top;
    wire_top top[WIRE_MAX_TOP_LOGPROBS];
    uint32_t n_logit_rows, n_vocab;
    float *logits; /* n_logit_rows * n_vocab, or NULL */
    char *error;   /* NULL, or why the sequence cannot go on (proto SeqResult.error; at most
                      WIRE_MAX_STR - 1 bytes): its token then ends it */
    uint32_t n_plp; /* sp.prompt_logprobs: row positions whose next token is known, in order */
    wire_plp *plp;
} wire_seq_result;

typedef struct wire_step_result {
    uint64_t step_id;
    bool ok;
    char error[WIRE_MAX_STR];
    uint32_t n_seqs;
    wire_seq_result *seqs;
} wire_step_result;

/* proto WorkerStats: counters since the worker started, device memory as of its last step */
typedef struct wire_worker_stats {
    uint64_t steps;
    double step_seconds;
    uint64_t allreduces;
    double allreduce_seconds;
    uint64_t device_mem_free, device_mem_total;
    uint64_t decode_steps; /* decode steps the engine timed itself (engine_ops.decode_time) */
    double decode_seconds;
} wire_worker_stats;

/* proto BackendConfig: a CUDA worker's kernel configuration (wire_decode: attention non-empty,
 * smem_cap <= smem_dev, attn_smem <= smem_cap) */
#define WIRE_MAX_ATTN_NAME 16
typedef struct wire_backend_cfg {
    uint32_t arch, arch_as;
    char attention[WIRE_MAX_ATTN_NAME];
    uint32_t attn_smem, smem_cap, smem_dev;
    bool wgmma;
} wire_backend_cfg;

typedef struct wire_control {
    wire_control_kind kind;
    uint32_t n_seq_ids;
    uint64_t *seq_ids;
    char message[WIRE_MAX_STR];
    int32_t status;
    uint32_t n_vocab;
    char model_path[WIRE_MAX_STR];
    uint32_t rank;
    uint64_t step_id;
    /* WIRE_CTL_LOADED only (status 0: kv_blocks >= 1, kv_block_size >= 1, kv_block_bytes >= 1) */
    uint32_t kv_blocks, kv_block_size;
    uint64_t kv_block_bytes;
    /* WIRE_CTL_NCCL_ID only (wire_decode: exactly WIRE_MAX_NCCL_ID bytes, rank 0; other kinds
     * carry none) */
    uint8_t nccl_id[WIRE_MAX_NCCL_ID];
    uint32_t nccl_id_len;
    /* WIRE_CTL_LOAD_PROGRESS only (wire_decode: load_done <= load_total) */
    uint64_t load_done, load_total;
    /* a worker's heartbeat (optional; wire_decode: finite seconds >= 0, free <= total) */
    bool has_stats;
    wire_worker_stats stats;
    /* WIRE_CTL_LOADED only (optional) */
    bool has_backend;
    wire_backend_cfg backend;
} wire_control;

/* `mlaserve bench` (worker/engine.h bench_fill / bench_coll). wire_decode checks: a known op;
 * FILL: 1..max_seqs distinct seq ids, n_past <= max_ctx, no COLL fields; COLL: 1 <= n_floats <=
 * WIRE_MAX_BENCH_FLOATS, 1 <= iters <= WIRE_MAX_BENCH_ITERS, no FILL fields. */
typedef enum wire_bench_op { WIRE_BENCH_FILL = 1, WIRE_BENCH_COLL = 2 } wire_bench_op;

typedef struct wire_bench {
    uint64_t bench_id;
    wire_bench_op op;
    uint32_t n_seq_ids;
    uint64_t *seq_ids;
    uint32_t n_past;
    uint64_t n_floats;
    uint32_t iters;
    /* FILL only: sequence i's table is blocks[i * blocks_per_seq, (i + 1) * blocks_per_seq);
     * wire_decode checks n_blocks == n_seq_ids * blocks_per_seq >= 1 and every id < max_blocks;
     * the engine checks that a table covers n_past positions at its block size */
    uint32_t blocks_per_seq;
    uint32_t n_blocks;
    uint32_t *blocks;
} wire_bench;

/* wire_decode checks: rank < world; not ok: an error message, ok: none; sec_per_op finite, >= 0. */
typedef struct wire_bench_result {
    uint64_t bench_id;
    uint32_t rank;
    bool ok;
    char error[WIRE_MAX_STR];
    double sec_per_op;
} wire_bench_result;

typedef struct wire_msg {
    wire_kind kind;
    union {
        wire_register reg;
        wire_register_reply reply;
        wire_step_plan plan;
        wire_step_result result;
        wire_control ctl;
        wire_bench bench;
        wire_bench_result bench_result;
    } u;
} wire_msg;

/* What the receiver knows, to bound what it accepts. Zero fields mean "unknown": token ids are
 * then only checked to be non-negative, positions against WIRE_MAX_CTX. */
typedef struct wire_limits {
    uint32_t n_vocab;
    uint32_t max_ctx;
    uint32_t max_seqs;   /* 0: WIRE_MAX_SEQS */
    uint32_t max_blocks; /* block ids < max_blocks; 0: WIRE_MAX_BLOCKS */
    uint32_t world;      /* rank checks in Control and BenchResult; 0: WIRE_MAX_WORLD */
    size_t max_frame;    /* 0: WIRE_MAX_FRAME */
} wire_limits;

int wire_encode(const wire_msg *m, uint8_t **out, size_t *len, mla_err *err);
int wire_decode(const void *buf, size_t len, const wire_limits *lim, wire_msg *out, mla_err *err);
void wire_msg_free(wire_msg *m);

const char *wire_kind_name(wire_kind k);

#endif
