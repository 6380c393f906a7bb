#include "wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla.pb-c.h"

const char *wire_kind_name(wire_kind k) {
    switch (k) {
    case WIRE_REGISTER: return "Register";
    case WIRE_REGISTER_REPLY: return "RegisterReply";
    case WIRE_STEP_PLAN: return "StepPlan";
    case WIRE_STEP_RESULT: return "StepResult";
    case WIRE_CONTROL: return "Control";
    case WIRE_BENCH: return "Bench";
    case WIRE_BENCH_RESULT: return "BenchResult";
    }
    return "?";
}

/* ---- encode -------------------------------------------------------------------------------- */

static char *s_or_empty(const char *s) { return (char *)(s ? s : ""); }

/* A token's n alternatives into the envelope's storage from tops[t] on (topp: their pointers);
 * returns the next free index */
static size_t pack_tops(const wire_top *src, size_t n, Mla__TopLogprob *tops, Mla__TopLogprob **topp, size_t t) {
    for (size_t k = 0; k < n; k++, t++) {
        mla__top_logprob__init(&tops[t]);
        tops[t].token = src[k].token;
        tops[t].logprob = src[k].logprob;
        topp[t] = &tops[t];
    }
    return t;
}

int wire_encode(const wire_msg *m, uint8_t **out, size_t *len, mla_err *err) {
    *out = NULL;
    *len = 0;
    Mla__Envelope env = MLA__ENVELOPE__INIT;
    env.magic = WIRE_MAGIC;
    env.version = WIRE_VERSION;
    env.kind = (Mla__FrameKind)m->kind;
    Mla__Register reg = MLA__REGISTER__INIT;
    Mla__RegisterReply rep = MLA__REGISTER_REPLY__INIT;
    Mla__StepPlan plan = MLA__STEP_PLAN__INIT;
    Mla__StepResult res = MLA__STEP_RESULT__INIT;
    Mla__Control ctl = MLA__CONTROL__INIT;
    Mla__WorkerStats wstats = MLA__WORKER_STATS__INIT;
    Mla__BackendConfig wback = MLA__BACKEND_CONFIG__INIT;
    Mla__Bench bench = MLA__BENCH__INIT;
    Mla__BenchResult bres = MLA__BENCH_RESULT__INIT;
    /* per-sequence storage for plans and results */
    Mla__SeqPlan *sps = NULL, **spp = NULL;
    Mla__SamplingParams *sms = NULL;
    Mla__SeqResult *srs = NULL, **srp = NULL;
    Mla__TopLogprob *tops = NULL, **topp = NULL;
    Mla__PromptLogprob *plps = NULL, **plpp = NULL;
    int rc = MLA_OK;

    switch (m->kind) {
    case WIRE_REGISTER:
        reg.rank = m->u.reg.rank;
        reg.world = m->u.reg.world;
        reg.host = s_or_empty(m->u.reg.host);
        reg.device = s_or_empty(m->u.reg.device);
        reg.protocol_version = m->u.reg.protocol_version;
        reg.model_hash = m->u.reg.model_hash;
        reg.pid = m->u.reg.pid;
        env.body_case = MLA__ENVELOPE__BODY_REG;
        env.reg = &reg;
        /* the envelope carries the version the sender speaks */
        env.version = m->u.reg.protocol_version;
        break;
    case WIRE_REGISTER_REPLY:
        rep.ok = m->u.reply.ok;
        rep.reason = s_or_empty(m->u.reply.reason);
        rep.coll_shm_name = s_or_empty(m->u.reply.coll_shm_name);
        rep.nccl_unique_id.len = m->u.reply.nccl_id_len;
        rep.nccl_unique_id.data = (uint8_t *)m->u.reply.nccl_id;
        rep.heartbeat_ms = m->u.reply.heartbeat_ms;
        rep.heartbeat_timeout_ms = m->u.reply.heartbeat_timeout_ms;
        rep.coll_timeout_ms = m->u.reply.coll_timeout_ms;
        rep.gpu_memory_utilization = m->u.reply.kv.gpu_memory_utilization;
        rep.kv_memory_bytes = m->u.reply.kv.kv_memory_bytes;
        rep.max_step_tokens = m->u.reply.kv.max_step_tokens;
        rep.max_context = m->u.reply.kv.max_context;
        rep.max_seqs = m->u.reply.kv.max_seqs;
        rep.local_group = m->u.reply.kv.local_group;
        rep.nccl_id_timeout_ms = m->u.reply.wo.nccl_id_timeout_ms;
        rep.spin_us = m->u.reply.wo.spin_us;
        rep.step_ahead = m->u.reply.wo.step_ahead;
        rep.nccl = m->u.reply.wo.nccl;
        rep.cuda_precision = m->u.reply.wo.cuda_precision;
        rep.allreduce = m->u.reply.wo.allreduce;
        rep.log_level = m->u.reply.wo.log_level;
        env.body_case = MLA__ENVELOPE__BODY_REPLY;
        env.reply = &rep;
        break;
    case WIRE_STEP_PLAN: {
        const wire_step_plan *p = &m->u.plan;
        plan.step_id = p->step_id;
        plan.n_seqs = p->n_seqs;
        sps = mla_xcalloc(p->n_seqs ? p->n_seqs : 1, sizeof *sps);
        spp = mla_xcalloc(p->n_seqs ? p->n_seqs : 1, sizeof *spp);
        sms = mla_xcalloc(p->n_seqs ? p->n_seqs : 1, sizeof *sms);
        for (uint32_t i = 0; i < p->n_seqs; i++) {
            const wire_seq *s = &p->seqs[i];
            mla__seq_plan__init(&sps[i]);
            mla__sampling_params__init(&sms[i]);
            sps[i].seq_id = s->seq_id;
            sps[i].n_tokens = s->n_tokens;
            sps[i].tokens = s->tokens;
            sps[i].n_positions = s->n_tokens;
            sps[i].positions = s->positions;
            sps[i].block_start = s->block_start;
            sps[i].n_blocks = s->n_blocks;
            sps[i].blocks = s->blocks;
            sps[i].sample = s->sample;
            sps[i].last = s->last;
            sps[i].has_next_token = s->sp.prompt_logprobs && s->next_token >= 0;
            sps[i].next_token = sps[i].has_next_token ? s->next_token : 0;
            sms[i].prompt_logprobs = s->sp.prompt_logprobs;
            sms[i].temperature = s->sp.temperature;
            sms[i].top_k = s->sp.top_k;
            sms[i].top_p = s->sp.top_p;
            sms[i].min_p = s->sp.min_p;
            sms[i].repetition_penalty = s->sp.repetition_penalty;
            sms[i].presence_penalty = s->sp.presence_penalty;
            sms[i].frequency_penalty = s->sp.frequency_penalty;
            sms[i].penalty_start = s->sp.penalty_start;
            sms[i].seed = s->sp.seed;
            sms[i].logprobs = s->sp.logprobs;
            sms[i].top_logprobs = s->sp.top_logprobs;
            sms[i].logits = (Mla__LogitsMode)s->sp.logits;
            sms[i].constrained = s->sp.constrained;
            sms[i].constraint_setup = s->sp.constraint_setup;
            sms[i].grammar = s_or_empty(s->sp.grammar);
            sms[i].grammar_start = s->sp.grammar_start;
            sms[i].n_replay = s->sp.n_replay;
            sms[i].replay = s->sp.replay;
            sms[i].n_bias_ids = s->sp.n_bias;
            sms[i].bias_ids = s->sp.bias_ids;
            sms[i].n_bias_values = s->sp.n_bias;
            sms[i].bias_values = s->sp.bias_vals;
            sms[i].min_tokens = s->sp.min_tokens;
            sms[i].n_ban_ids = s->sp.n_ban;
            sms[i].ban_ids = s->sp.ban_ids;
            sps[i].sampling = &sms[i];
            spp[i] = &sps[i];
        }
        plan.seqs = spp;
        env.body_case = MLA__ENVELOPE__BODY_PLAN;
        env.plan = &plan;
        break;
    }
    case WIRE_STEP_RESULT: {
        const wire_step_result *r = &m->u.result;
        res.step_id = r->step_id;
        res.ok = r->ok;
        res.error = s_or_empty(r->error);
        res.n_seqs = r->n_seqs;
        size_t ntop = 0, nplp = 0;
        for (uint32_t i = 0; i < r->n_seqs; i++) {
            ntop += r->seqs[i].n_top;
            nplp += r->seqs[i].n_plp;
            for (uint32_t k = 0; k < r->seqs[i].n_plp; k++) ntop += r->seqs[i].plp[k].n_top;
        }
        srs = mla_xcalloc(r->n_seqs ? r->n_seqs : 1, sizeof *srs);
        srp = mla_xcalloc(r->n_seqs ? r->n_seqs : 1, sizeof *srp);
        tops = mla_xcalloc(ntop ? ntop : 1, sizeof *tops);
        topp = mla_xcalloc(ntop ? ntop : 1, sizeof *topp);
        plps = mla_xcalloc(nplp ? nplp : 1, sizeof *plps);
        plpp = mla_xcalloc(nplp ? nplp : 1, sizeof *plpp);
        size_t t = 0, q = 0;
        for (uint32_t i = 0; i < r->n_seqs; i++) {
            const wire_seq_result *s = &r->seqs[i];
            mla__seq_result__init(&srs[i]);
            srs[i].seq_id = s->seq_id;
            srs[i].token = s->token;
            srs[i].logprob = s->logprob;
            srs[i].n_top = s->n_top;
            srs[i].top = topp + t;
            t = pack_tops(s->top, s->n_top, tops, topp, t);
            srs[i].n_logit_rows = s->n_logit_rows;
            srs[i].n_vocab = s->n_vocab;
            srs[i].n_logits = s->logits ? (size_t)s->n_logit_rows * s->n_vocab : 0;
            srs[i].logits = s->logits;
            if (s->error) srs[i].error = s->error;
            srs[i].n_prompt_logprobs = s->n_plp;
            srs[i].prompt_logprobs = plpp + q;
            for (uint32_t k = 0; k < s->n_plp; k++, q++) {
                const wire_plp *w = &s->plp[k];
                mla__prompt_logprob__init(&plps[q]);
                plps[q].logprob = w->logprob;
                plps[q].n_top = w->n_top;
                plps[q].top = topp + t;
                t = pack_tops(w->top, w->n_top, tops, topp, t);
                plpp[q] = &plps[q];
            }
            srp[i] = &srs[i];
        }
        res.seqs = srp;
        env.body_case = MLA__ENVELOPE__BODY_RESULT;
        env.result = &res;
        break;
    }
    case WIRE_CONTROL:
        ctl.kind = (Mla__ControlKind)m->u.ctl.kind;
        ctl.n_seq_ids = m->u.ctl.n_seq_ids;
        ctl.seq_ids = m->u.ctl.seq_ids;
        ctl.message = s_or_empty(m->u.ctl.message);
        ctl.status = m->u.ctl.status;
        ctl.n_vocab = m->u.ctl.n_vocab;
        ctl.model_path = s_or_empty(m->u.ctl.model_path);
        ctl.rank = m->u.ctl.rank;
        ctl.step_id = m->u.ctl.step_id;
        ctl.kv_blocks = m->u.ctl.kv_blocks;
        ctl.kv_block_size = m->u.ctl.kv_block_size;
        ctl.kv_block_bytes = m->u.ctl.kv_block_bytes;
        if (m->u.ctl.nccl_id_len > WIRE_MAX_NCCL_ID)
            return mla_errf(err, "wire: NCCL id of %u bytes", m->u.ctl.nccl_id_len);
        ctl.nccl_id.len = m->u.ctl.nccl_id_len;
        ctl.nccl_id.data = (uint8_t *)m->u.ctl.nccl_id;
        ctl.load_done = m->u.ctl.load_done;
        ctl.load_total = m->u.ctl.load_total;
        if (m->u.ctl.has_stats) {
            const wire_worker_stats *ws = &m->u.ctl.stats;
            wstats.steps = ws->steps;
            wstats.step_seconds = ws->step_seconds;
            wstats.allreduces = ws->allreduces;
            wstats.allreduce_seconds = ws->allreduce_seconds;
            wstats.device_mem_free = ws->device_mem_free;
            wstats.device_mem_total = ws->device_mem_total;
            wstats.decode_steps = ws->decode_steps;
            wstats.decode_seconds = ws->decode_seconds;
            ctl.stats = &wstats;
        }
        if (m->u.ctl.has_backend) {
            const wire_backend_cfg *b = &m->u.ctl.backend;
            wback.arch = b->arch;
            wback.arch_as = b->arch_as;
            wback.attention = (char *)b->attention;
            wback.attn_smem = b->attn_smem;
            wback.smem_cap = b->smem_cap;
            wback.smem_dev = b->smem_dev;
            wback.wgmma = b->wgmma;
            ctl.backend = &wback;
        }
        env.body_case = MLA__ENVELOPE__BODY_CONTROL;
        env.control = &ctl;
        break;
    case WIRE_BENCH:
        bench.bench_id = m->u.bench.bench_id;
        bench.op = (Mla__BenchOp)m->u.bench.op;
        bench.n_seq_ids = m->u.bench.n_seq_ids;
        bench.seq_ids = m->u.bench.seq_ids;
        bench.n_past = m->u.bench.n_past;
        bench.n_floats = m->u.bench.n_floats;
        bench.iters = m->u.bench.iters;
        bench.blocks_per_seq = m->u.bench.blocks_per_seq;
        bench.n_blocks = m->u.bench.n_blocks;
        bench.blocks = m->u.bench.blocks;
        env.body_case = MLA__ENVELOPE__BODY_BENCH;
        env.bench = &bench;
        break;
    case WIRE_BENCH_RESULT:
        bres.bench_id = m->u.bench_result.bench_id;
        bres.rank = m->u.bench_result.rank;
        bres.ok = m->u.bench_result.ok;
        bres.error = s_or_empty(m->u.bench_result.error);
        bres.sec_per_op = m->u.bench_result.sec_per_op;
        env.body_case = MLA__ENVELOPE__BODY_BENCH_RESULT;
        env.bench_result = &bres;
        break;
    default:
        return mla_errf(err, "wire: cannot encode frame kind %d", (int)m->kind);
    }
    size_t n = mla__envelope__get_packed_size(&env);
    if (n > WIRE_MAX_FRAME) {
        rc = mla_errf(err, "wire: %s frame of %zu bytes exceeds the limit of %zu",
                      wire_kind_name(m->kind), n, WIRE_MAX_FRAME);
    } else {
        uint8_t *buf = mla_xmalloc(n);
        size_t w = mla__envelope__pack(&env, buf);
        MLA_ASSERT(w == n);
        *out = buf;
        *len = n;
    }
    free(sps);
    free(spp);
    free(sms);
    free(srs);
    free(srp);
    free(tops);
    free(topp);
    free(plps);
    free(plpp);
    return rc;
}

/* ---- decode + validate --------------------------------------------------------------------- */

/* copies a protobuf string that must be printable ASCII/UTF-8 without control characters. */
static int copy_str(char *dst, size_t cap, const char *src, const char *field, mla_err *err) {
    if (!src) src = "";
    size_t n = strlen(src);
    if (n >= cap) return mla_errf(err, "wire: %s is %zu bytes long (limit %zu)", field, n, cap - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c < 0x20 || c == 0x7f)
            return mla_errf(err, "wire: %s holds a control character at byte %zu", field, i);
    }
    memcpy(dst, src, n + 1);
    return MLA_OK;
}

static int is_shm_name(const char *s) {
    size_t n = strlen(s);
    if (n < 2 || n >= 64 || s[0] != '/') return 0;
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* 1 when all n ids are distinct */
static int ids_unique(const uint64_t *ids, size_t n) {
    if (n < 2) return 1;
    uint64_t *c = mla_xmalloc(n * sizeof *c);
    memcpy(c, ids, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_u64);
    int ok = 1;
    for (size_t i = 1; i < n; i++)
        if (c[i] == c[i - 1]) ok = 0;
    free(c);
    return ok;
}

/* 1 when all n token ids are distinct (n <= WIRE_MAX_BAN: pairwise) */
static int distinct_ids(const int32_t *ids, size_t n) {
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (ids[i] == ids[j]) return 0;
    return 1;
}

static int check_sampling(const Mla__SamplingParams *p, uint64_t seq, const wire_limits *lim,
                          wire_sampling *o, mla_err *err) {
    if (!p) {
        memset(o, 0, sizeof *o);
        o->top_p = 1.0f;
        o->repetition_penalty = 1.0f;
        return MLA_OK;
    }
#define BAD(...) return mla_errf(err, __VA_ARGS__)
    if (!isfinite(p->temperature) || p->temperature < 0 || p->temperature > 100)
        BAD("wire: seq %llu: temperature %g outside [0, 100]", (unsigned long long)seq, p->temperature);
    if (p->top_k < 0 || (lim->n_vocab && (uint32_t)p->top_k > lim->n_vocab))
        BAD("wire: seq %llu: top_k %d outside [0, vocab]", (unsigned long long)seq, p->top_k);
    if (!isfinite(p->top_p) || p->top_p < 0 || p->top_p > 1)
        BAD("wire: seq %llu: top_p %g outside [0, 1]", (unsigned long long)seq, p->top_p);
    if (!isfinite(p->min_p) || p->min_p < 0 || p->min_p > 1)
        BAD("wire: seq %llu: min_p %g outside [0, 1]", (unsigned long long)seq, p->min_p);
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty < 0 || p->repetition_penalty > 100)
        BAD("wire: seq %llu: repetition_penalty %g outside [0, 100]", (unsigned long long)seq,
            p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || fabsf(p->presence_penalty) > 100)
        BAD("wire: seq %llu: presence_penalty %g outside [-100, 100]", (unsigned long long)seq,
            p->presence_penalty);
    if (!isfinite(p->frequency_penalty) || fabsf(p->frequency_penalty) > 100)
        BAD("wire: seq %llu: frequency_penalty %g outside [-100, 100]", (unsigned long long)seq,
            p->frequency_penalty);
    if (p->penalty_start > (lim->max_ctx ? lim->max_ctx : WIRE_MAX_CTX))
        BAD("wire: seq %llu: penalty_start %u past the context", (unsigned long long)seq, p->penalty_start);
    if (p->top_logprobs > WIRE_MAX_TOP_LOGPROBS)
        BAD("wire: seq %llu: top_logprobs %u exceeds %d", (unsigned long long)seq, p->top_logprobs,
            WIRE_MAX_TOP_LOGPROBS);
    if ((int)p->logits < 0 || (int)p->logits > 2)
        BAD("wire: seq %llu: logits mode %d unknown", (unsigned long long)seq, (int)p->logits);
    size_t glen = p->grammar ? strlen(p->grammar) : 0;
    if (glen > WIRE_MAX_GRAMMAR)
        BAD("wire: seq %llu: grammar of %zu bytes exceeds %u", (unsigned long long)seq, glen, WIRE_MAX_GRAMMAR);
    if (p->n_bias_ids != p->n_bias_values)
        BAD("wire: seq %llu: %zu logit bias ids but %zu values", (unsigned long long)seq, p->n_bias_ids,
            p->n_bias_values);
    if (p->n_bias_ids > WIRE_MAX_BIAS)
        BAD("wire: seq %llu: %zu logit biases exceed %d", (unsigned long long)seq, p->n_bias_ids, WIRE_MAX_BIAS);
    for (size_t k = 0; k < p->n_bias_ids; k++) {
        if (p->bias_ids[k] < 0 || (lim->n_vocab && (uint32_t)p->bias_ids[k] >= lim->n_vocab))
            BAD("wire: seq %llu: logit bias token %d outside the vocabulary", (unsigned long long)seq, p->bias_ids[k]);
        if (!isfinite(p->bias_values[k]) || fabsf(p->bias_values[k]) > 100)
            BAD("wire: seq %llu: logit bias %g outside [-100, 100]", (unsigned long long)seq, p->bias_values[k]);
    }
    if (p->n_ban_ids > WIRE_MAX_BAN)
        BAD("wire: seq %llu: %zu banned tokens exceed %d", (unsigned long long)seq, p->n_ban_ids, WIRE_MAX_BAN);
    for (size_t k = 0; k < p->n_ban_ids; k++)
        if (p->ban_ids[k] < 0 || (lim->n_vocab && (uint32_t)p->ban_ids[k] >= lim->n_vocab))
            BAD("wire: seq %llu: banned token %d outside the vocabulary", (unsigned long long)seq, p->ban_ids[k]);
    if (p->n_ban_ids && !distinct_ids(p->ban_ids, p->n_ban_ids))
        BAD("wire: seq %llu: a banned token listed twice", (unsigned long long)seq);
    if (p->min_tokens > (lim->max_ctx ? lim->max_ctx : WIRE_MAX_CTX))
        BAD("wire: seq %llu: min_tokens %u past the context", (unsigned long long)seq, p->min_tokens);
    if (p->n_replay > (lim->max_ctx ? lim->max_ctx : WIRE_MAX_CTX))
        BAD("wire: seq %llu: %zu replayed tokens exceed the context", (unsigned long long)seq, p->n_replay);
    for (size_t k = 0; k < p->n_replay; k++)
        if (p->replay[k] < 0 || (lim->n_vocab && (uint32_t)p->replay[k] >= lim->n_vocab))
            BAD("wire: seq %llu: replayed token %d outside the vocabulary", (unsigned long long)seq, p->replay[k]);
    if ((glen || p->n_bias_ids || p->n_replay || p->n_ban_ids || p->min_tokens) && !p->constraint_setup)
        BAD("wire: seq %llu: grammar, biases, banned or replayed tokens without constraint_setup",
            (unsigned long long)seq);
    if (p->constraint_setup && !p->constrained)
        BAD("wire: seq %llu: constraint_setup on a row that is not constrained", (unsigned long long)seq);
#undef BAD
    o->temperature = p->temperature;
    o->top_k = p->top_k;
    o->top_p = p->top_p == 0 ? 1.0f : p->top_p;
    o->min_p = p->min_p;
    o->repetition_penalty = p->repetition_penalty == 0 ? 1.0f : p->repetition_penalty;
    o->presence_penalty = p->presence_penalty;
    o->frequency_penalty = p->frequency_penalty;
    o->penalty_start = p->penalty_start;
    o->seed = p->seed;
    o->logprobs = p->logprobs;
    o->top_logprobs = p->top_logprobs;
    o->logits = (wire_logits_mode)p->logits;
    o->prompt_logprobs = p->prompt_logprobs;
    o->constrained = p->constrained;
    o->constraint_setup = p->constraint_setup;
    o->grammar_start = p->grammar_start;
    if (glen) o->grammar = mla_xstrdup(p->grammar);
    o->n_replay = (uint32_t)p->n_replay;
    if (p->n_replay) {
        o->replay = mla_xmalloc(p->n_replay * sizeof *o->replay);
        memcpy(o->replay, p->replay, p->n_replay * sizeof *o->replay);
    }
    o->n_bias = (uint32_t)p->n_bias_ids;
    if (p->n_bias_ids) {
        o->bias_ids = mla_xmalloc(p->n_bias_ids * sizeof *o->bias_ids);
        o->bias_vals = mla_xmalloc(p->n_bias_ids * sizeof *o->bias_vals);
        memcpy(o->bias_ids, p->bias_ids, p->n_bias_ids * sizeof *o->bias_ids);
        memcpy(o->bias_vals, p->bias_values, p->n_bias_ids * sizeof *o->bias_vals);
    }
    o->min_tokens = p->min_tokens;
    o->n_ban = (uint32_t)p->n_ban_ids;
    if (p->n_ban_ids) {
        o->ban_ids = mla_xmalloc(p->n_ban_ids * sizeof *o->ban_ids);
        memcpy(o->ban_ids, p->ban_ids, p->n_ban_ids * sizeof *o->ban_ids);
    }
    return MLA_OK;
}

static int decode_plan(const Mla__StepPlan *p, const wire_limits *lim, wire_step_plan *o,
                       mla_err *err) {
    uint32_t max_seqs = lim->max_seqs ? lim->max_seqs : WIRE_MAX_SEQS;
    uint32_t max_ctx = lim->max_ctx ? lim->max_ctx : WIRE_MAX_CTX;
    uint32_t max_blocks = lim->max_blocks ? lim->max_blocks : WIRE_MAX_BLOCKS;
    if (p->n_seqs == 0 || p->n_seqs > max_seqs)
        return mla_errf(err, "wire: step plan with %zu sequences (1..%u allowed)", p->n_seqs, max_seqs);
    size_t total = 0;
    uint64_t *ids = mla_xmalloc(p->n_seqs * sizeof *ids);
    for (size_t i = 0; i < p->n_seqs; i++) {
        const Mla__SeqPlan *s = p->seqs[i];
        ids[i] = s->seq_id;
        if (s->n_tokens == 0 || s->n_tokens != s->n_positions) {
            free(ids);
            return mla_errf(err, "wire: seq %llu: %zu tokens and %zu positions (need equal, >= 1)",
                            (unsigned long long)s->seq_id, s->n_tokens, s->n_positions);
        }
        total += s->n_tokens;
        if (total > WIRE_MAX_STEP_TOKENS) {
            free(ids);
            return mla_errf(err, "wire: step plan holds more than %u tokens", WIRE_MAX_STEP_TOKENS);
        }
        for (size_t k = 0; k < s->n_tokens; k++) {
            int32_t t = s->tokens[k], pos = s->positions[k];
            if (t < 0 || (lim->n_vocab && (uint32_t)t >= lim->n_vocab)) {
                free(ids);
                return mla_errf(err, "wire: seq %llu: token %d at index %zu outside the vocabulary (%u)",
                                (unsigned long long)s->seq_id, t, k, lim->n_vocab);
            }
            if (pos < 0 || (uint32_t)pos >= max_ctx || (k > 0 && pos != s->positions[k - 1] + 1)) {
                free(ids);
                return mla_errf(err, "wire: seq %llu: position %d at index %zu is out of range or "
                                "not consecutive (context %u)",
                                (unsigned long long)s->seq_id, pos, k, max_ctx);
            }
        }
        if (s->n_blocks > max_blocks || s->block_start > max_blocks - s->n_blocks) {
            free(ids);
            return mla_errf(err, "wire: seq %llu: block table of %u + %zu entries (limit %u)",
                            (unsigned long long)s->seq_id, s->block_start, s->n_blocks, max_blocks);
        }
        for (size_t k = 0; k < s->n_blocks; k++)
            if (s->blocks[k] >= max_blocks) {
                free(ids);
                return mla_errf(err, "wire: seq %llu: block %u at table entry %zu outside the pool of %u blocks",
                                (unsigned long long)s->seq_id, s->blocks[k], s->block_start + k, max_blocks);
            }
        if (s->has_next_token && (s->next_token < 0 || (lim->n_vocab && (uint32_t)s->next_token >= lim->n_vocab))) {
            free(ids);
            return mla_errf(err, "wire: seq %llu: next token %d outside the vocabulary (%u)",
                            (unsigned long long)s->seq_id, s->next_token, lim->n_vocab);
        }
        if (s->last && !s->sample) {
            free(ids);
            return mla_errf(err, "wire: seq %llu: a last row must sample (its token is the last)",
                            (unsigned long long)s->seq_id);
        }
        const bool plp = s->sampling && s->sampling->prompt_logprobs;
        if ((s->has_next_token && !plp) ||
            (plp && s->sampling->logits != MLA__LOGITS_MODE__LOGITS_ALL)) {
            free(ids);
            return mla_errf(err, "wire: seq %llu: prompt logprobs need the logits of every row, and a next token "
                            "needs prompt logprobs", (unsigned long long)s->seq_id);
        }
    }
    int uniq = ids_unique(ids, p->n_seqs);
    free(ids);
    if (!uniq) return mla_errf(err, "wire: step plan lists a sequence id twice");

    o->step_id = p->step_id;
    o->n_seqs = (uint32_t)p->n_seqs;
    o->seqs = mla_xcalloc(p->n_seqs, sizeof *o->seqs);
    for (size_t i = 0; i < p->n_seqs; i++) {
        const Mla__SeqPlan *s = p->seqs[i];
        wire_seq *d = &o->seqs[i];
        d->seq_id = s->seq_id;
        d->n_tokens = (uint32_t)s->n_tokens;
        d->sample = s->sample;
        d->last = s->last;
        d->next_token = s->has_next_token ? s->next_token : -1;
        d->block_start = s->block_start;
        d->n_blocks = (uint32_t)s->n_blocks;
        if (s->n_blocks) {
            d->blocks = mla_xmalloc(s->n_blocks * sizeof *d->blocks);
            memcpy(d->blocks, s->blocks, s->n_blocks * sizeof *d->blocks);
        }
        d->tokens = mla_xmalloc(s->n_tokens * sizeof *d->tokens);
        d->positions = mla_xmalloc(s->n_tokens * sizeof *d->positions);
        memcpy(d->tokens, s->tokens, s->n_tokens * sizeof *d->tokens);
        memcpy(d->positions, s->positions, s->n_tokens * sizeof *d->positions);
        if (check_sampling(s->sampling, s->seq_id, lim, &d->sp, err)) {
            o->n_seqs = (uint32_t)i + 1;
            return MLA_ERR; /* caller frees what was built */
        }
    }
    return MLA_OK;
}

/* The first of n decoded alternatives that is invalid (a token outside the vocabulary, a logprob
 * not <= 0), or n when all are valid */
static size_t bad_top(Mla__TopLogprob *const *top, size_t n, const wire_limits *lim) {
    for (size_t k = 0; k < n; k++) {
        const Mla__TopLogprob *t = top[k];
        if (t->token < 0 || (lim->n_vocab && (uint32_t)t->token >= lim->n_vocab) || isnan(t->logprob) ||
            t->logprob > 0)
            return k;
    }
    return n;
}

/* n decoded alternatives into dst */
static void copy_tops(Mla__TopLogprob *const *src, size_t n, wire_top *dst) {
    for (size_t k = 0; k < n; k++) dst[k] = (wire_top){src[k]->token, src[k]->logprob};
}

static int decode_result(const Mla__StepResult *r, const wire_limits *lim, wire_step_result *o,
                         mla_err *err) {
    uint32_t max_seqs = lim->max_seqs ? lim->max_seqs : WIRE_MAX_SEQS;
    o->step_id = r->step_id;
    o->ok = r->ok;
    if (copy_str(o->error, sizeof o->error, r->error, "StepResult.error", err)) return MLA_ERR;
    if (!r->ok) {
        if (!o->error[0]) return mla_errf(err, "wire: failed step result without an error message");
        if (r->n_seqs) return mla_errf(err, "wire: failed step result carries sequences");
        return MLA_OK;
    }
    if (r->n_seqs > max_seqs)
        return mla_errf(err, "wire: step result with %zu sequences (limit %u)", r->n_seqs, max_seqs);
    uint64_t *ids = mla_xmalloc((r->n_seqs ? r->n_seqs : 1) * sizeof *ids);
    for (size_t i = 0; i < r->n_seqs; i++) ids[i] = r->seqs[i]->seq_id;
    int uniq = ids_unique(ids, r->n_seqs);
    free(ids);
    if (!uniq) return mla_errf(err, "wire: step result lists a sequence id twice");
    size_t total_logits = 0;
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Mla__SeqResult *s = r->seqs[i];
        unsigned long long id = (unsigned long long)s->seq_id;
        if (s->token < -1 || (lim->n_vocab && s->token >= 0 && (uint32_t)s->token >= lim->n_vocab))
            return mla_errf(err, "wire: seq %llu: sampled token %d outside the vocabulary", id, s->token);
        if (isnan(s->logprob) || s->logprob > 0)
            return mla_errf(err, "wire: seq %llu: logprob %g is not <= 0", id, s->logprob);
        if (s->n_top > WIRE_MAX_TOP_LOGPROBS)
            return mla_errf(err, "wire: seq %llu: %zu top logprobs (limit %d)", id, s->n_top,
                            WIRE_MAX_TOP_LOGPROBS);
        const size_t bk = bad_top(s->top, s->n_top, lim);
        if (bk < s->n_top)
            return mla_errf(err, "wire: seq %llu: top logprob %zu (token %d, %g) invalid", id, bk,
                            s->top[bk]->token, s->top[bk]->logprob);
        if (s->n_logits) {
            if (s->n_vocab == 0 || (lim->n_vocab && s->n_vocab != lim->n_vocab) ||
                s->n_logit_rows == 0 || s->n_logit_rows > WIRE_MAX_STEP_TOKENS ||
                (uint64_t)s->n_logit_rows * s->n_vocab != s->n_logits)
                return mla_errf(err, "wire: seq %llu: %zu logits do not match %u rows x %u vocab", id,
                                s->n_logits, s->n_logit_rows, s->n_vocab);
            total_logits += s->n_logits;
        } else if (s->n_logit_rows) {
            return mla_errf(err, "wire: seq %llu: %u logit rows announced, none sent", id, s->n_logit_rows);
        }
        if (s->error && strlen(s->error) >= WIRE_MAX_STR)
            return mla_errf(err, "wire: seq %llu: an error of %zu bytes (limit %d)", id, strlen(s->error),
                            WIRE_MAX_STR - 1);
        if (s->n_prompt_logprobs > WIRE_MAX_STEP_TOKENS)
            return mla_errf(err, "wire: seq %llu: %zu prompt logprobs (limit %u)", id, s->n_prompt_logprobs,
                            WIRE_MAX_STEP_TOKENS);
        if (s->n_prompt_logprobs && s->n_logits)
            return mla_errf(err, "wire: seq %llu: prompt logprobs beside logits", id);
        for (size_t k = 0; k < s->n_prompt_logprobs; k++) {
            const Mla__PromptLogprob *pl = s->prompt_logprobs[k];
            if (isnan(pl->logprob) || pl->logprob > 0)
                return mla_errf(err, "wire: seq %llu: prompt logprob %zu (%g) is not <= 0", id, k, pl->logprob);
            if (pl->n_top > WIRE_MAX_TOP_LOGPROBS)
                return mla_errf(err, "wire: seq %llu: prompt logprob %zu with %zu alternatives (limit %d)", id, k,
                                pl->n_top, WIRE_MAX_TOP_LOGPROBS);
            const size_t bj = bad_top(pl->top, pl->n_top, lim);
            if (bj < pl->n_top)
                return mla_errf(err, "wire: seq %llu: prompt logprob %zu, alternative %zu (token %d, %g) invalid",
                                id, k, bj, pl->top[bj]->token, pl->top[bj]->logprob);
        }
    }
    (void)total_logits; /* bounded by the frame size */
    o->n_seqs = (uint32_t)r->n_seqs;
    o->seqs = mla_xcalloc(r->n_seqs ? r->n_seqs : 1, sizeof *o->seqs);
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Mla__SeqResult *s = r->seqs[i];
        wire_seq_result *d = &o->seqs[i];
        d->seq_id = s->seq_id;
        d->token = s->token;
        d->logprob = s->logprob;
        d->n_top = (uint32_t)s->n_top;
        copy_tops(s->top, s->n_top, d->top);
        if (s->n_logits) {
            d->n_logit_rows = s->n_logit_rows;
            d->n_vocab = s->n_vocab;
            d->logits = mla_xmalloc(s->n_logits * sizeof(float));
            memcpy(d->logits, s->logits, s->n_logits * sizeof(float));
        }
        if (s->error && s->error[0]) d->error = mla_xstrdup(s->error);
        if (s->n_prompt_logprobs) {
            d->n_plp = (uint32_t)s->n_prompt_logprobs;
            d->plp = mla_xcalloc(s->n_prompt_logprobs, sizeof *d->plp);
            for (size_t k = 0; k < s->n_prompt_logprobs; k++) {
                const Mla__PromptLogprob *pl = s->prompt_logprobs[k];
                d->plp[k].logprob = pl->logprob;
                d->plp[k].n_top = (uint32_t)pl->n_top;
                copy_tops(pl->top, pl->n_top, d->plp[k].top);
            }
        }
    }
    return MLA_OK;
}

static int decode_control(const Mla__Control *c, const wire_limits *lim, wire_control *o,
                          mla_err *err) {
    uint32_t max_seqs = lim->max_seqs ? lim->max_seqs : WIRE_MAX_SEQS;
    uint32_t world = lim->world ? lim->world : WIRE_MAX_WORLD;
    if ((int)c->kind < WIRE_CTL_HEARTBEAT || (int)c->kind > WIRE_CTL_LOAD_PROGRESS)
        return mla_errf(err, "wire: unknown control kind %d", (int)c->kind);
    if (c->n_seq_ids > max_seqs)
        return mla_errf(err, "wire: control frame lists %zu sequences (limit %u)", c->n_seq_ids, max_seqs);
    if ((int)c->kind != WIRE_CTL_FREE_SEQ && c->n_seq_ids)
        return mla_errf(err, "wire: control kind %d carries sequence ids", (int)c->kind);
    if (c->rank >= world) return mla_errf(err, "wire: control frame from rank %u (world %u)", c->rank, world);
    if ((int)c->kind == WIRE_CTL_LOADED && c->status == 0 &&
        (c->n_vocab == 0 || c->n_vocab > (1u << 24)))
        return mla_errf(err, "wire: loaded control frame with vocabulary size %u", c->n_vocab);
    if ((int)c->kind == WIRE_CTL_LOADED && c->status == 0 &&
        (c->kv_blocks == 0 || c->kv_blocks > WIRE_MAX_BLOCKS || c->kv_block_size == 0 ||
         c->kv_block_size > WIRE_MAX_CTX || c->kv_block_bytes == 0))
        return mla_errf(err, "wire: loaded control frame with a cache pool of %u blocks of %u positions, %llu bytes each",
                        c->kv_blocks, c->kv_block_size, (unsigned long long)c->kv_block_bytes);
    if ((int)c->kind != WIRE_CTL_LOADED && (c->kv_blocks || c->kv_block_size || c->kv_block_bytes))
        return mla_errf(err, "wire: control kind %d carries a cache pool", (int)c->kind);
    if ((int)c->kind == WIRE_CTL_ERROR && (!c->message || !c->message[0]))
        return mla_errf(err, "wire: error control frame without a message");
    if ((int)c->kind == WIRE_CTL_NCCL_ID) {
        if (c->nccl_id.len != WIRE_MAX_NCCL_ID)
            return mla_errf(err, "wire: NCCL id control frame with %zu bytes of id (need exactly %u)",
                            c->nccl_id.len, (unsigned)WIRE_MAX_NCCL_ID);
        if (c->rank != 0) return mla_errf(err, "wire: NCCL id control frame from rank %u (only rank 0 makes it)", c->rank);
    } else if (c->nccl_id.len) {
        return mla_errf(err, "wire: control kind %d carries an NCCL id", (int)c->kind);
    }
    if ((int)c->kind == WIRE_CTL_LOAD_PROGRESS) {
        if (c->load_done > c->load_total)
            return mla_errf(err, "wire: load progress of %llu bytes beyond the total %llu",
                            (unsigned long long)c->load_done, (unsigned long long)c->load_total);
    } else if (c->load_done || c->load_total) {
        return mla_errf(err, "wire: control kind %d carries load progress", (int)c->kind);
    }
    if (c->stats) {
        const Mla__WorkerStats *ws = c->stats;
        if ((int)c->kind != WIRE_CTL_HEARTBEAT) return mla_errf(err, "wire: control kind %d carries worker stats", (int)c->kind);
        if (!(ws->step_seconds >= 0 && ws->step_seconds < 1e15 && ws->allreduce_seconds >= 0 &&
              ws->allreduce_seconds < 1e15 && ws->decode_seconds >= 0 && ws->decode_seconds < 1e15))
            return mla_errf(err, "wire: worker stats with a time that is not a finite number of seconds >= 0");
        if (ws->device_mem_free > ws->device_mem_total)
            return mla_errf(err, "wire: worker stats with more free device memory than in all");
        if (ws->decode_steps == 0 && ws->decode_seconds != 0)
            return mla_errf(err, "wire: worker stats with decode time but no decode steps");
        o->has_stats = true;
        o->stats = (wire_worker_stats){ws->steps, ws->step_seconds, ws->allreduces, ws->allreduce_seconds,
                                       ws->device_mem_free, ws->device_mem_total, ws->decode_steps,
                                       ws->decode_seconds};
    }
    if (c->backend) {
        const Mla__BackendConfig *b = c->backend;
        if ((int)c->kind != WIRE_CTL_LOADED)
            return mla_errf(err, "wire: control kind %d carries a backend configuration", (int)c->kind);
        bool name_ok = b->attention && b->attention[0];
        for (const char *q = b->attention; name_ok && *q; q++) /* a metric label: letters and digits */
            name_ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9');
        if (!name_ok || b->smem_cap > b->smem_dev || b->attn_smem > b->smem_cap)
            return mla_errf(err, "wire: backend configuration with attention '%s', %u bytes of shared memory a block "
                                 "of %u allowed (device %u)",
                            b->attention ? b->attention : "", b->attn_smem, b->smem_cap, b->smem_dev);
        o->has_backend = true;
        o->backend = (wire_backend_cfg){.arch = b->arch, .arch_as = b->arch_as, .attn_smem = b->attn_smem,
                                        .smem_cap = b->smem_cap, .smem_dev = b->smem_dev, .wgmma = b->wgmma};
        if (copy_str(o->backend.attention, sizeof o->backend.attention, b->attention, "BackendConfig.attention", err))
            return MLA_ERR;
    }
    o->load_done = c->load_done;
    o->load_total = c->load_total;
    o->kind = (wire_control_kind)c->kind;
    o->status = c->status;
    o->n_vocab = c->n_vocab;
    o->rank = c->rank;
    o->step_id = c->step_id;
    o->kv_blocks = c->kv_blocks;
    o->kv_block_size = c->kv_block_size;
    o->kv_block_bytes = c->kv_block_bytes;
    if (c->nccl_id.len) memcpy(o->nccl_id, c->nccl_id.data, c->nccl_id.len);
    o->nccl_id_len = (uint32_t)c->nccl_id.len;
    if (copy_str(o->message, sizeof o->message, c->message, "Control.message", err)) return MLA_ERR;
    if (copy_str(o->model_path, sizeof o->model_path, c->model_path, "Control.model_path", err))
        return MLA_ERR;
    if (!ids_unique(c->seq_ids, c->n_seq_ids))
        return mla_errf(err, "wire: control frame lists a sequence id twice");
    o->n_seq_ids = (uint32_t)c->n_seq_ids;
    if (c->n_seq_ids) {
        o->seq_ids = mla_xmalloc(c->n_seq_ids * sizeof *o->seq_ids);
        memcpy(o->seq_ids, c->seq_ids, c->n_seq_ids * sizeof *o->seq_ids);
    }
    return MLA_OK;
}

static int decode_bench(const Mla__Bench *b, const wire_limits *lim, wire_bench *o, mla_err *err) {
    uint32_t max_seqs = lim->max_seqs ? lim->max_seqs : WIRE_MAX_SEQS;
    uint32_t max_ctx = lim->max_ctx ? lim->max_ctx : WIRE_MAX_CTX;
    uint32_t max_blocks = lim->max_blocks ? lim->max_blocks : WIRE_MAX_BLOCKS;
    unsigned long long id = (unsigned long long)b->bench_id;
    if ((int)b->op == WIRE_BENCH_FILL) {
        if (b->n_seq_ids == 0 || b->n_seq_ids > max_seqs)
            return mla_errf(err, "wire: bench %llu: fill of %zu sequences (1..%u allowed)", id, b->n_seq_ids, max_seqs);
        if (b->n_past > max_ctx)
            return mla_errf(err, "wire: bench %llu: fill to %u positions exceeds the context limit %u", id, b->n_past,
                            max_ctx);
        if (b->n_floats || b->iters)
            return mla_errf(err, "wire: bench %llu: a fill carries all-reduce fields (n_floats %llu, iters %u)", id,
                            (unsigned long long)b->n_floats, b->iters);
        if (!ids_unique(b->seq_ids, b->n_seq_ids))
            return mla_errf(err, "wire: bench %llu: fill lists a sequence id twice", id);
        if (b->blocks_per_seq == 0 || b->blocks_per_seq > max_blocks ||
            (uint64_t)b->blocks_per_seq * b->n_seq_ids != b->n_blocks)
            return mla_errf(err, "wire: bench %llu: %zu blocks for %zu sequences of %u blocks each", id, b->n_blocks,
                            b->n_seq_ids, b->blocks_per_seq);
        for (size_t k = 0; k < b->n_blocks; k++)
            if (b->blocks[k] >= max_blocks)
                return mla_errf(err, "wire: bench %llu: block %u outside the pool of %u blocks", id, b->blocks[k],
                                max_blocks);
    } else if ((int)b->op == WIRE_BENCH_COLL) {
        if (b->n_floats == 0 || b->n_floats > WIRE_MAX_BENCH_FLOATS)
            return mla_errf(err, "wire: bench %llu: all-reduce of %llu floats (1..%llu allowed)", id,
                            (unsigned long long)b->n_floats, (unsigned long long)WIRE_MAX_BENCH_FLOATS);
        if (b->iters == 0 || b->iters > WIRE_MAX_BENCH_ITERS)
            return mla_errf(err, "wire: bench %llu: %u all-reduce iterations (1..%u allowed)", id, b->iters,
                            WIRE_MAX_BENCH_ITERS);
        if (b->n_seq_ids || b->n_past || b->n_blocks || b->blocks_per_seq)
            return mla_errf(err, "wire: bench %llu: an all-reduce carries fill fields (%zu sequences, n_past %u)", id,
                            b->n_seq_ids, b->n_past);
    } else {
        return mla_errf(err, "wire: bench %llu: unknown op %d", id, (int)b->op);
    }
    o->bench_id = b->bench_id;
    o->op = (wire_bench_op)b->op;
    o->n_past = b->n_past;
    o->n_floats = b->n_floats;
    o->iters = b->iters;
    o->n_seq_ids = (uint32_t)b->n_seq_ids;
    if (b->n_seq_ids) {
        o->seq_ids = mla_xmalloc(b->n_seq_ids * sizeof *o->seq_ids);
        memcpy(o->seq_ids, b->seq_ids, b->n_seq_ids * sizeof *o->seq_ids);
    }
    o->blocks_per_seq = b->blocks_per_seq;
    o->n_blocks = (uint32_t)b->n_blocks;
    if (b->n_blocks) {
        o->blocks = mla_xmalloc(b->n_blocks * sizeof *o->blocks);
        memcpy(o->blocks, b->blocks, b->n_blocks * sizeof *o->blocks);
    }
    return MLA_OK;
}

static int decode_bench_result(const Mla__BenchResult *r, const wire_limits *lim, wire_bench_result *o,
                               mla_err *err) {
    uint32_t world = lim->world ? lim->world : WIRE_MAX_WORLD;
    unsigned long long id = (unsigned long long)r->bench_id;
    if (r->rank >= world) return mla_errf(err, "wire: bench result %llu from rank %u (world %u)", id, r->rank, world);
    if (copy_str(o->error, sizeof o->error, r->error, "BenchResult.error", err)) return MLA_ERR;
    if (!r->ok && !o->error[0]) return mla_errf(err, "wire: failed bench result %llu without an error message", id);
    if (r->ok && o->error[0]) return mla_errf(err, "wire: successful bench result %llu carries an error message", id);
    if (!isfinite(r->sec_per_op) || r->sec_per_op < 0 || r->sec_per_op > 1e6)
        return mla_errf(err, "wire: bench result %llu: %g seconds per operation", id, r->sec_per_op);
    o->bench_id = r->bench_id;
    o->rank = r->rank;
    o->ok = r->ok;
    o->sec_per_op = r->sec_per_op;
    return MLA_OK;
}

int wire_decode(const void *buf, size_t len, const wire_limits *lim_in, wire_msg *out, mla_err *err) {
    memset(out, 0, sizeof *out);
    wire_limits lim0 = {0};
    const wire_limits *lim = lim_in ? lim_in : &lim0;
    size_t max_frame = lim->max_frame ? lim->max_frame : WIRE_MAX_FRAME;
    if (len > max_frame) return mla_errf(err, "wire: frame of %zu bytes exceeds the limit of %zu", len, max_frame);
    if (len == 0) return mla_errf(err, "wire: empty frame");
    Mla__Envelope *env = mla__envelope__unpack(NULL, len, buf);
    if (!env) return mla_errf(err, "wire: frame of %zu bytes is not a valid protobuf envelope", len);
    int rc = MLA_OK;
    if (env->magic != WIRE_MAGIC) {
        rc = mla_errf(err, "wire: bad magic 0x%08x", env->magic);
        goto done;
    }
    int expect_case = 0;
    switch ((int)env->kind) {
    case WIRE_REGISTER: expect_case = MLA__ENVELOPE__BODY_REG; break;
    case WIRE_REGISTER_REPLY: expect_case = MLA__ENVELOPE__BODY_REPLY; break;
    case WIRE_STEP_PLAN: expect_case = MLA__ENVELOPE__BODY_PLAN; break;
    case WIRE_STEP_RESULT: expect_case = MLA__ENVELOPE__BODY_RESULT; break;
    case WIRE_CONTROL: expect_case = MLA__ENVELOPE__BODY_CONTROL; break;
    case WIRE_BENCH: expect_case = MLA__ENVELOPE__BODY_BENCH; break;
    case WIRE_BENCH_RESULT: expect_case = MLA__ENVELOPE__BODY_BENCH_RESULT; break;
    default:
        rc = mla_errf(err, "wire: unknown frame kind %d", (int)env->kind);
        goto done;
    }
    if ((int)env->body_case != expect_case) {
        rc = mla_errf(err, "wire: frame kind %s does not match its body", wire_kind_name((wire_kind)env->kind));
        goto done;
    }
    /* A Register of another protocol version is decoded (so that it can be refused with a
     * reason); every other frame must speak our version. */
    if (env->kind != (Mla__FrameKind)WIRE_REGISTER && env->version != WIRE_VERSION) {
        rc = mla_errf(err, "wire: protocol version %u, expected %u", env->version, WIRE_VERSION);
        goto done;
    }
    out->kind = (wire_kind)env->kind;
    switch (out->kind) {
    case WIRE_REGISTER: {
        const Mla__Register *r = env->reg;
        wire_register *o = &out->u.reg;
        if (r->protocol_version != env->version) {
            rc = mla_errf(err, "wire: register frame version %u disagrees with its envelope (%u)",
                          r->protocol_version, env->version);
            break;
        }
        if (r->world == 0 || r->world > WIRE_MAX_WORLD || r->rank >= r->world) {
            rc = mla_errf(err, "wire: register: rank %u / world %u out of range", r->rank, r->world);
            break;
        }
        if (r->pid <= 0) {
            rc = mla_errf(err, "wire: register: pid %d", r->pid);
            break;
        }
        o->rank = r->rank;
        o->world = r->world;
        o->protocol_version = r->protocol_version;
        o->model_hash = r->model_hash;
        o->pid = r->pid;
        if (copy_str(o->host, sizeof o->host, r->host, "Register.host", err) ||
            copy_str(o->device, sizeof o->device, r->device, "Register.device", err))
            rc = MLA_ERR;
        break;
    }
    case WIRE_REGISTER_REPLY: {
        const Mla__RegisterReply *r = env->reply;
        wire_register_reply *o = &out->u.reply;
        o->ok = r->ok;
        if (copy_str(o->reason, sizeof o->reason, r->reason, "RegisterReply.reason", err) ||
            copy_str(o->coll_shm_name, sizeof o->coll_shm_name, r->coll_shm_name,
                     "RegisterReply.coll_shm_name", err)) {
            rc = MLA_ERR;
            break;
        }
        if (r->nccl_unique_id.len > WIRE_MAX_NCCL_ID) {
            rc = mla_errf(err, "wire: NCCL id of %zu bytes", r->nccl_unique_id.len);
            break;
        }
        if (!r->ok && !o->reason[0]) {
            rc = mla_errf(err, "wire: refusal without a reason");
            break;
        }
        if (r->ok) {
            if (o->coll_shm_name[0] && !is_shm_name(o->coll_shm_name)) {
                rc = mla_errf(err, "wire: collective name '%s' is not a shared-memory name", o->coll_shm_name);
                break;
            }
            if (r->heartbeat_ms < 10 || r->heartbeat_ms > 60000 ||
                r->heartbeat_timeout_ms <= r->heartbeat_ms || r->heartbeat_timeout_ms > 3600000 ||
                r->coll_timeout_ms > 3600000) {
                rc = mla_errf(err, "wire: heartbeat %u ms / timeout %u ms / collective timeout %u ms invalid",
                              r->heartbeat_ms, r->heartbeat_timeout_ms, r->coll_timeout_ms);
                break;
            }
        }
        if (r->nccl_unique_id.len) memcpy(o->nccl_id, r->nccl_unique_id.data, r->nccl_unique_id.len);
        o->nccl_id_len = (uint32_t)r->nccl_unique_id.len;
        o->heartbeat_ms = r->heartbeat_ms;
        o->heartbeat_timeout_ms = r->heartbeat_timeout_ms;
        o->coll_timeout_ms = r->coll_timeout_ms;
        if (r->ok && (!(r->gpu_memory_utilization > 0.0f && r->gpu_memory_utilization <= 1.0f) ||
                      r->max_step_tokens == 0 || r->max_step_tokens > WIRE_MAX_STEP_TOKENS ||
                      r->max_context > WIRE_MAX_CTX || r->max_seqs == 0 || r->max_seqs > WIRE_MAX_SEQS)) {
            rc = mla_errf(err, "wire: cache pool settings invalid (gpu_memory_utilization %g, max_step_tokens %u, "
                               "max_context %u, max_seqs %u)",
                          r->gpu_memory_utilization, r->max_step_tokens, r->max_context, r->max_seqs);
            break;
        }
        o->kv.gpu_memory_utilization = r->gpu_memory_utilization;
        o->kv.kv_memory_bytes = r->kv_memory_bytes;
        o->kv.max_step_tokens = r->max_step_tokens;
        o->kv.max_context = r->max_context;
        o->kv.max_seqs = r->max_seqs;
        o->kv.local_group = r->local_group;
        if (r->nccl_id_timeout_ms > 3600000 || r->spin_us > 1000000 || r->step_ahead > WIRE_AHEAD_SYNC ||
            r->nccl > WIRE_NCCL_REQUIRED || r->cuda_precision > WIRE_PREC_EXACT || r->allreduce > WIRE_AR_ONESHOT ||
            r->log_level > 4) {
            rc = mla_errf(err, "wire: worker settings invalid (nccl_id_timeout_ms %u, spin_us %d, step_ahead %u, "
                               "nccl %u, cuda_precision %u, allreduce %u, log_level %u)",
                          r->nccl_id_timeout_ms, r->spin_us, r->step_ahead, r->nccl, r->cuda_precision, r->allreduce,
                          r->log_level);
            break;
        }
        o->wo.nccl_id_timeout_ms = r->nccl_id_timeout_ms;
        o->wo.spin_us = r->spin_us < 0 ? -1 : r->spin_us;
        o->wo.step_ahead = r->step_ahead;
        o->wo.nccl = r->nccl;
        o->wo.cuda_precision = r->cuda_precision;
        o->wo.allreduce = r->allreduce;
        o->wo.log_level = r->log_level;
        break;
    }
    case WIRE_STEP_PLAN: rc = decode_plan(env->plan, lim, &out->u.plan, err); break;
    case WIRE_STEP_RESULT: rc = decode_result(env->result, lim, &out->u.result, err); break;
    case WIRE_CONTROL: rc = decode_control(env->control, lim, &out->u.ctl, err); break;
    case WIRE_BENCH: rc = decode_bench(env->bench, lim, &out->u.bench, err); break;
    case WIRE_BENCH_RESULT: rc = decode_bench_result(env->bench_result, lim, &out->u.bench_result, err); break;
    }
done:
    mla__envelope__free_unpacked(env, NULL);
    if (rc) wire_msg_free(out);
    return rc;
}

void wire_msg_free(wire_msg *m) {
    if (!m) return;
    switch (m->kind) {
    case WIRE_STEP_PLAN:
        if (m->u.plan.seqs)
            for (uint32_t i = 0; i < m->u.plan.n_seqs; i++) {
                free(m->u.plan.seqs[i].tokens);
                free(m->u.plan.seqs[i].positions);
                free(m->u.plan.seqs[i].blocks);
                free(m->u.plan.seqs[i].sp.grammar);
                free(m->u.plan.seqs[i].sp.replay);
                free(m->u.plan.seqs[i].sp.bias_ids);
                free(m->u.plan.seqs[i].sp.bias_vals);
                free(m->u.plan.seqs[i].sp.ban_ids);
            }
        free(m->u.plan.seqs);
        break;
    case WIRE_STEP_RESULT:
        if (m->u.result.seqs)
            for (uint32_t i = 0; i < m->u.result.n_seqs; i++) {
                free(m->u.result.seqs[i].logits);
                free(m->u.result.seqs[i].error);
                free(m->u.result.seqs[i].plp);
            }
        free(m->u.result.seqs);
        break;
    case WIRE_CONTROL: free(m->u.ctl.seq_ids); break;
    case WIRE_BENCH:
        free(m->u.bench.seq_ids);
        free(m->u.bench.blocks);
        break;
    default: break;
    }
    memset(m, 0, sizeof *m);
}
