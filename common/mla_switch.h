/* mla_switch: the one registry of the MLA_* environment variables the programs read.
 *
 * Every switch is a row of one table (common/mla_switch.c): its name, type (bool: 0 or 1; int
 * within a range; string; enum: one of a fixed list), default, meaning, and whether it is a
 * developer switch (measurement, fault injection, test engines). Developer switches exist only in
 * a build configured with MLA_DEV_SWITCHES=ON (the test build; OFF in Release): in another build
 * they are not in the table and setting one is the unknown-variable error. User settings are not
 * switches: they are command-line flags (common/opts.c) the coordinator hands to the workers.
 *
 * The getters read the environment once (the first call; thread-safe) and return the value, or
 * the default when the variable is unset or empty. A bad value is caught by mla_switch_check,
 * which every program calls at start (mlaserve, mlaserve-worker): a value outside the type, and
 * any set MLA_* variable that is not in the table, fail the start with a message naming the
 * variable and what it accepts. `mlaserve env` prints the table (mla_switch_print).
 *
 * Ownership: the table and every string returned are static; nothing to free. */
#ifndef MLA_SWITCH_H
#define MLA_SWITCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The switch ids, in table order. A developer switch keeps its id in every build (the code that
 * reads it compiles everywhere); where the build has no developer switches its getter returns
 * the default. A new switch: an id here (before MLA_SW_COUNT) and its row at the same place in
 * the table of common/mla_switch.c (the `switch` test checks the order and the count of 12). */
typedef enum mla_sw_id {
    MLA_SW_STEP_TRACE,              /* dev: directory for per-step timestamps (common/steptrace.c) */
    MLA_SW_LOAD_LAYER_DELAY_MS,     /* dev: fault injection, a slow load */
    MLA_SW_WORKER_STEP_DELAY_MS,    /* dev: fault injection, a slow step */
    MLA_SW_WORKER_HOST_SAMPLE,      /* dev: 1 samples every non-greedy row on the host (A/B) */
    MLA_SW_LOCAL_LINK,              /* dev: 0 keeps every frame of a local worker on ZeroMQ */
    MLA_SW_ROPE_FREQ_BF16,          /* dev: RoPE inverse frequencies rounded to bf16 (HF fixtures) */
    MLA_SW_CUDA_ATTN,               /* dev: CUDA attention in tc or fp32 (A/B against the default) */
    MLA_SW_CUDA_KV,                 /* dev: CUDA latent cache element type f16 or f32 (A/B) */
    MLA_SW_TEST_ENGINE_DELAY_MS,    /* dev: test engine knobs (tests/ctrl/test_engine.h) */
    MLA_SW_TEST_ENGINE_FAIL_LOAD,
    MLA_SW_TEST_ENGINE_ID_SEED,
    MLA_SW_TEST_ENGINE_ID_CORRUPT,
    MLA_SW_TEST_ENGINE_ID_NOPUB,
    MLA_SW_TEST_ENGINE_STATS,
    MLA_SW_CUDA_GRAPHS,             /* CUDA decode steps as graphs: 0, 1 or require (a check) */
    MLA_SW_CUDA_BATCHED,            /* CUDA single-token steps on the batched path (0: the prompt path) */
    MLA_SW_CUDA_Q8,                 /* CUDA integer GEMV / int8 tensor cores for quantized weights */
    MLA_SW_CUDA_SMEM_CAP,           /* CUDA kernels as on a smaller part: sm120 or sm100 limits, no wgmma */
    MLA_SW_CUDA_GEMV_TMAX,          /* dev: CUDA fp16 tensor cores above this many tokens a step */
    MLA_SW_MOE_MMH_MIN,             /* dev: CUDA experts on the fp16 tensor cores from these pairs a expert */
    MLA_SW_CUDA_GS,                 /* dev: streamed GEMV stages and bytes a stage (measurements) */
    MLA_SW_CUDA_GM,                 /* dev: streamed tensor-core GEMV shared memory a block, KB */
    MLA_SW_CUDA_GEMVM_TMIN,         /* dev: CUDA dense steps from this many tokens on the int8 tensor-core GEMV */
    MLA_SW_CUDA_GEMVM_GRP,          /* dev: CUDA experts of 2+ pairs on the int8 tensor-core GEMV in steps of up to this many tokens */
    MLA_SW_CUDA_STEPTRACE,          /* dev: CUDA kernel-wait trace prefix (MLA_CUDA_STEPTRACE builds) */
    MLA_SW_CUDA_STEPTRACE_RECORDS,  /* dev: that trace's buffer, in block records */
    MLA_SW_CUDA_PREFILL_MIN,        /* dev: CUDA prompt steps from this many tokens in the non-absorbed form */
    MLA_SW_SCHED_HOLD,              /* dev: the scheduler's first step waits for this many requests */
    MLA_SW_COUNT
} mla_sw_id;

typedef enum mla_sw_type { MLA_SWT_BOOL, MLA_SWT_INT, MLA_SWT_STR, MLA_SWT_ENUM } mla_sw_type;

typedef struct mla_sw_def {
    mla_sw_id id;
    const char *name;    /* "MLA_STEP_TRACE" */
    mla_sw_type type;
    const char *def;     /* the default as text ("0", "", "tc"); "" for an unset string */
    long lo, hi;         /* MLA_SWT_INT: the accepted range */
    const char *choices; /* MLA_SWT_ENUM: the accepted values, '|'-separated ("tc|fp32") */
    const char *meaning; /* one line */
    bool dev_only;       /* a developer switch (MLA_DEV_SWITCHES builds only) */
} mla_sw_def;

/* The value of a switch of type bool, int, or string/enum (NULL when unset with no default). It
 * is a bug (abort) to read a switch through the getter of another type. */
bool mla_sw_bool(mla_sw_id id);
long mla_sw_int(mla_sw_id id);
const char *mla_sw_str(mla_sw_id id);
/* whether the variable is set (non-empty) in this build's table */
bool mla_sw_is_set(mla_sw_id id);

/* The start-up check: every MLA_* variable of the environment is a switch of this build with a
 * value of its type. MLA_ERR with "NAME=VALUE: expected ..." or "NAME: unknown variable ..." in
 * err[0..n) on the first problem (all of them are listed, '; '-separated, as far as n allows);
 * MLA_OK otherwise. The names in mla_switch_external (read by the build and test scripts, not by
 * the programs) pass. */
int mla_switch_check(char *err, size_t n);

/* the row of a switch, and whether this build has it (false: a developer switch in a build
 * without MLA_DEV_SWITCHES) */
const mla_sw_def *mla_sw_def_of(mla_sw_id id);
bool mla_sw_available(mla_sw_id id);
/* whether this build was configured with MLA_DEV_SWITCHES=ON */
bool mla_switch_dev_build(void);

/* Prints the table of this build: name, type, default, current value, meaning (a header line,
 * then one line a switch, tab-separated columns padded for reading). */
void mla_switch_print(FILE *f);

/* Tests: forget the values read, so the next getter reads the environment again. Not safe while
 * another thread reads a switch. */
void mla_switch_reset(void);

#ifdef __cplusplus
}
#endif

#endif
