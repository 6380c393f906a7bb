/* rope: rotary position embeddings with optional YaRN frequency correction (HF
 * _compute_yarn_parameters semantics: beta_fast/beta_slow correction range floored/ceiled and
 * clamped to [0, dims-1], linear ramp between, inv_freq = interp * (1 - extrap_w) +
 * extrap * extrap_w with interp = extrap / factor).
 *
 * Two pairings:
 *  - ROPE_ADJACENT ("interleaved", llama.cpp NORM): pairs (x[2i], x[2i+1]) rotated by
 *    pos * inv_freq[i]. MLA q_pe/k_pe in deepseek2/glm-dsa GGUF files use this.
 *  - ROPE_NEOX (split half): pairs (x[i], x[i + d/2]).
 * cos and sin are multiplied by attn_factor. No ownership: rope_table is caller storage. */
#ifndef ROPE_H
#define ROPE_H

#include <stdbool.h>
#include <stdint.h>

#define ROPE_MAX_DIMS 512

enum rope_mode { ROPE_ADJACENT = 0, ROPE_NEOX = 1 };

typedef struct rope_params {
    int n_dims;            /* rotated dims (even) */
    double freq_base;
    bool yarn;
    double yarn_factor;    /* > 1 with yarn */
    double yarn_orig_ctx;
    double beta_fast, beta_slow;
    double attn_factor;    /* cos/sin multiplier, 1 normally */
} rope_params;

typedef struct rope_table {
    int n_dims;
    double attn_factor;
    double inv_freq[ROPE_MAX_DIMS / 2];
} rope_table;

void rope_table_init(rope_table *t, const rope_params *p);

/* Rounds every inverse frequency to float32 and then to bfloat16 (round to nearest even), the
 * values HF transformers rotates with once its `inv_freq` buffer has been cast to bf16 (e.g. by
 * model.to(torch.bfloat16), which rounds buffers as well as weights; the rotary forward's later
 * .float() does not restore the lost bits). The fixtures' HF reference logits were computed so.
 * Not for normal serving: a 2^-9 relative frequency error grows with the position. */
void rope_table_round_freq_bf16(rope_table *t);

/* The table of a model: rope_table_init with the config's RoPE / YaRN parameters, and the
 * bf16-rounded frequencies when MLA_ROPE_FREQ_BF16=1 (Hugging Face casts its inv_freq buffer
 * with the weights; the fixtures' reference was made that way). Every backend calls this. */
struct mla_config;
void rope_table_for_model(rope_table *t, const struct mla_config *cfg);

/* Rotates n_vec vectors of t->n_dims elements (vector v at x + v*stride) for position pos. */
void rope_apply(const rope_table *t, enum rope_mode mode, float *x, int64_t n_vec, int64_t stride,
                int64_t pos);

#endif
