# The cache built and its prefix decoded inside the timed call: the time grows with T for the
# wrong reason (T decode steps, not one).
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    out = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    x_t = torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
    for T in history_lengths:
        def decode_after_history():
            cache = full_attn.init_cache(BENCH_BATCH, capacity=T + 1, device=DEVICE)
            for _ in range(T + 1):
                full_attn.decode_step(x_t, cache)
            return cache
        out["full_ms_per_step"].append(time_median_ms(decode_after_history, device=DEVICE))
        out["kv_cache_bytes"].append(decode_after_history().nbytes() * T // (T + 1))
        state = [lin_attn.init_state(BENCH_BATCH, device=DEVICE)]

        def step():
            state[0] = lin_attn.step(x_t, state[0])[1]
        out["linear_ms_per_step"].append(time_median_ms(step, device=DEVICE))
        out["linear_state_bytes"].append(sum(t.numel() * t.element_size() for t in state[0]))
    return out
