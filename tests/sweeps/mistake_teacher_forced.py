# A whole teacher-forced pass over the history for each layer, divided by nothing: a training
# step, not a decode step.
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    out = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    head_dim = BENCH_DIM // BENCH_HEADS
    for T in history_lengths:
        history = torch.randn(BENCH_BATCH, T + 1, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
        out["full_ms_per_step"].append(time_median_ms(lambda: full_attn(history), device=DEVICE))
        out["linear_ms_per_step"].append(time_median_ms(lambda: lin_attn(history), device=DEVICE))
        out["kv_cache_bytes"].append(2 * BENCH_BATCH * T * BENCH_DIM * BYTES_PER_ELEMENT)
        out["linear_state_bytes"].append(BENCH_BATCH * BENCH_HEADS * (head_dim + 1) * head_dim * BYTES_PER_ELEMENT)
    return out
