// optim.h: how a step turns the ranks' gradients into new weights, behind one small interface. After the last
// backward of a step, train_step calls, in this order:
//   exchange  the gradients leave for the other ranks (and come back averaged, or compressed);
//   norm      the gradient norm: on the device (m->norm), or the pieces of its square, added to the step's host sync;
//   update    the weights, at the step's learning rate (with the norm the sync agreed on).
// One implementation is chosen once (optimizer_setup), from --zero and --comm; each is AdamW:
//   adamw   gradients all-reduced in buckets (fp32, or bf16 with --comm bf16), AdamW (model.h)
//   zero1   gradients reduce-scattered, each rank's AdamW on its shard of the weights, then all-gathered (comm.h)
//   onebit  1-bit Adam (compress.h): AdamW (the bf16 all-reduce) for the warm-up; then only the momentum's signs
//           and scales are exchanged, under the next forward, but on the variance steps (AdamW, ever further
//           apart: onebit_schedule). Which of these a step is, optimizer_begin says at the step's start.
// Part of trainer.cu (one translation unit): included after model.h, comm.h and compress.h.
#pragma once

typedef struct Optimizer Optimizer;
struct Optimizer {
    const char* name;
    GradReduce* gr;
    OneBit* ob;                   // onebit: its state (compress.h); else NULL
    float b1, b2, eps, wd, clip;  // --beta1, --beta2, --eps, --wd, --clip
    int bf16;                     // --comm bf16
    int compressed;               // this step (onebit, after the warm-up, not a refresh): no gradient reduced
    int sumsq_div;                // the norm is sqrt(the sync's sum of squares / sumsq_div); 0: m->norm
    double ranks_sq;              // onebit: the last compressed step's norm^2 (the mean over ranks of |g_r|^2)
    double avg_ratio;             // onebit: |averaged g|^2 / that at the variance step after it (0: not yet)
    void (*exchange)(Optimizer* op, BertModel* m);
    void (*norm)(Optimizer* op, BertModel* m, float* sumsq);
    void (*update)(Optimizer* op, BertModel* m, float lr, float norm);
};

// adamw: the buckets' all-reduce (launched on the communication stream, waiting for the backward's events:
// it overlaps what is left of the backward), the norm of the averaged gradient, the update.
static void exchange_buckets(Optimizer* op, BertModel* m) {
    grad_reduce_launch(op->gr, m->grad);
    grad_reduce_wait(op->gr, m->stream);
}
static void norm_on_device(Optimizer* op, BertModel* m, float* sumsq) { bert_grad_norm(m); }
static void update_adamw(Optimizer* op, BertModel* m, float lr, float norm) {
    bert_adamw_step(m, lr, op->b1, op->b2, op->eps, op->wd, op->clip);
}

// zero1: the same call reduce-scatters (the GradReduce was laid out for ZeRO-1); each rank has only its pieces of
// the averaged gradient, so the norm's square is summed over the ranks with the step's sync; then AdamW on this
// rank's pieces of every bucket and the weights all-gathered.
static void norm_zero1(Optimizer* op, BertModel* m, float* sumsq) {
    zero_grad_sumsq(op->gr, m->grad, m->norm_partial, sumsq, m->stream);
}
static void update_zero1(Optimizer* op, BertModel* m, float lr, float norm) {
    m->step++;
    for (int i = 0; i < op->gr->n; i++) {
        size_t off, n;
        grad_reduce_piece(op->gr, &op->gr->b[i], op->gr->comm->rank, &off, &n);
        if (n) bert_adamw_range(m, off, n, op->gr->b[i].state_off, lr, op->b1, op->b2, op->eps, op->wd, op->clip);
    }
    zero_allgather(op->gr, m->w, m->stream);
}

// onebit: after the warm-up a compressed step reduces no gradient: the norm (for the log and the non-finite check)
// is sqrt(mean over ranks of |g_r|^2), from the ranks' local sums of squares in the step's sync, and clipping uses
// the averaged gradient's estimated from it (onebit_clip_norm); then onebit_step_forward exchanges the clipped
// momentum part by part and updates the weights on the communication stream, under the next step's forward. A
// variance step (and the warm-up) reduces the gradients in bf16 (half fp32's bytes, as --comm bf16), and a variance
// step updates v lazily (compress.h: onebit_schedule).
static void exchange_onebit(Optimizer* op, BertModel* m) {
    if (!op->compressed) exchange_buckets(op, m);  // (a compressed step's parts leave at the update)
}
static void norm_onebit(Optimizer* op, BertModel* m, float* sumsq) {
    if (!op->compressed) {
        bert_grad_norm(m);
        return;
    }
    // this rank's own (not averaged) gradient's sum of squares
    launch(grad_norm_partial, dim3(launch_grid_cap()), dim3(256), 0, m->stream, m->norm_partial, (const float*)m->grad,
           m->p.numel);
    launch(accumulate_sum, dim3(1), dim3(256), 0, m->stream, sumsq, (const float*)m->norm_partial, launch_grid_cap());
}
// onebit_clip_norm: the norm --clip compares on a compressed step. The step's norm there is the ranks' (the root of
// the mean of |g_r|^2), which the per-rank noise makes larger than the averaged gradient's that an AdamW step clips
// by (about sqrt(P) x when the noise dominates): clipped by it, the compressed steps would move less than the
// variance steps between them, and their momentum would mix two scales. So the ranks' norm is scaled by the ratio
// |averaged g|^2 / |g_r|^2 measured at the last variance step (its averaged norm over the compressed step just
// before it): sqrt(ratio) x the ranks' norm estimates the averaged gradient's. Before the first variance step after
// a compressed one (the ratio unknown, as after a resume) the ranks' norm itself. Measured (docs/scaling.md: the
// mini preset, 4 CPU ranks, T=32, 300 steps, seed 1337): 1.26% above fp32's training loss clipped by the ranks'
// norm, 0.22% by the estimate.
static float onebit_clip_norm(Optimizer* op, float norm) {
    op->ranks_sq = (double)norm * norm;
    return op->avg_ratio > 0 ? (float)(sqrt(op->avg_ratio) * norm) : norm;
}
// onebit_clip_observe: a variance step's averaged norm, for the ratio (after at least one compressed step).
static void onebit_clip_observe(Optimizer* op, float norm) {
    if (op->ranks_sq > 0) op->avg_ratio = (double)norm * norm / op->ranks_sq;
}
static void update_onebit(Optimizer* op, BertModel* m, float lr, float norm) {
    OneBit* ob = op->ob;
    if (op->compressed) {
        // --clip's factor, of the averaged gradient's norm as estimated from the ranks' (see onebit_clip_norm)
        float est = onebit_clip_norm(op, norm), clip = op->clip > 0.f && est > op->clip ? op->clip / est : 1.f;
        // the parts leave now, clipped, and update the weights under the next step's forward
        onebit_step_forward(ob, op->gr, m->step + 1, m->grad, m->master, m->w, m->adam_m, m->adam_v, m->p.n_decay, lr,
                            op->b1, op->b2, op->eps, op->wd, clip);
        m->step++;
    } else if (m->step + 1 > ob->warmup) {  // a variance step: v decays by b2^I (I steps since its last update)
        onebit_clip_observe(op, norm);
        m->step++;
        onebit_refresh_update(ob, m->stream, m->step, m->master, m->w, m->grad, m->adam_m, m->adam_v, m->p.n_decay,
                              m->norm, lr, op->b1, op->b2, op->eps, op->wd, op->clip);
    } else {
        update_adamw(op, m, lr, norm);
    }
}

// optimizer_setup: the implementation the flags ask for (they were checked: onebit is not with --zero 1).
static Optimizer optimizer_setup(GradReduce* gr, OneBit* ob, int bf16, float b1, float b2, float eps, float wd,
                                 float clip) {
    Optimizer op;
    memset(&op, 0, sizeof op);
    op.gr = gr, op.ob = ob, op.bf16 = bf16;
    op.b1 = b1, op.b2 = b2, op.eps = eps, op.wd = wd, op.clip = clip;
    op.name = ob ? "onebit" : gr->zero ? "zero1" : "adamw";
    op.exchange = ob ? exchange_onebit : exchange_buckets;
    op.norm = ob ? norm_onebit : gr->zero ? norm_zero1 : norm_on_device;
    op.update = ob ? update_onebit : gr->zero ? update_zero1 : update_adamw;
    return op;
}

// optimizer_begin: what the step about to run is (onebit: compressed or not), and so how its gradients travel.
static void optimizer_begin(Optimizer* op, const BertModel* m) {
    int t = m->step + 1;
    op->compressed = op->ob && t > op->ob->warmup && !onebit_is_refresh(op->ob, t);
    op->gr->bf16 = op->bf16 || op->ob;  // (onebit: the warm-up's and the refreshes' all-reduce in bf16)
    op->sumsq_div = op->compressed ? op->gr->comm->world : op->gr->zero ? 1 : 0;
}

// optimizer_end: the gradients zeroed for the next step (a compressed step leaves that to onebit_step_forward, on
// the communication stream once the parts have left).
static void optimizer_end(Optimizer* op, BertModel* m, int skipped) {
    if (!op->compressed || skipped) bert_zero_grad(m);
}
