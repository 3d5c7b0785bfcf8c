# A roomy cache that is never rewound: each timed call (and the warm-up before) appends, so the
# calls see T + 1, T + 2, ... tokens instead of T.
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    out = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    head_dim = BENCH_DIM // BENCH_HEADS
    x_t = torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
    for T in history_lengths:
        cache = full_attn.init_cache(BENCH_BATCH, capacity=T + 128, device=DEVICE)
        cache.keys[:, :, :T] = torch.randn(BENCH_BATCH, BENCH_HEADS, T, head_dim)
        cache.values[:, :, :T] = torch.randn(BENCH_BATCH, BENCH_HEADS, T, head_dim)
        cache.length = T
        out["full_ms_per_step"].append(time_median_ms(lambda: full_attn.decode_step(x_t, cache), device=DEVICE))
        out["kv_cache_bytes"].append(2 * BENCH_BATCH * T * BENCH_DIM * BYTES_PER_ELEMENT)
        state = [lin_attn.init_state(BENCH_BATCH, device=DEVICE)]

        def step():
            state[0] = lin_attn.step(x_t, state[0])[1]
        out["linear_ms_per_step"].append(time_median_ms(step, device=DEVICE))
        out["linear_state_bytes"].append(sum(t.numel() * t.element_size() for t in state[0]))
    return out
