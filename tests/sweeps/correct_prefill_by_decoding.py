# The prefix written by real decode steps before timing, a roomy cache rewound by a lambda, and the
# linear state started from zeros and carried through a closure.
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    out = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    x_t = torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
    for T in history_lengths:
        cache = full_attn.init_cache(BENCH_BATCH, capacity=2 * T, device=DEVICE)
        for _ in range(T):
            full_attn.decode_step(torch.randn_like(x_t), cache)
        out["full_ms_per_step"].append(time_median_ms(lambda: full_attn.decode_step(x_t, cache), device=DEVICE,
                                                      setup=lambda: setattr(cache, "length", T)))
        cache.length = T
        out["kv_cache_bytes"].append(cache.nbytes())

        state = lin_attn.init_state(BENCH_BATCH, device=DEVICE)

        def one_step():
            nonlocal state
            _, state = lin_attn.step(x_t, state)
        out["linear_ms_per_step"].append(time_median_ms(one_step, device=DEVICE))
        out["linear_state_bytes"].append(sum(t.numel() * t.element_size() for t in state))
    return out
