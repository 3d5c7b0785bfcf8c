# The cache built with KVCache directly and filled in place; each step measured twice and the
# smaller median kept; the state warmed up by a few steps and kept in a dict.
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    head_dim = BENCH_DIM // BENCH_HEADS
    full, linear, kv, lin = [], [], [], []
    x_t = torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
    for T in history_lengths:
        cache = KVCache(BENCH_BATCH, BENCH_HEADS, head_dim, T + 8, device=DEVICE, dtype=BENCH_DTYPE)
        cache.keys[:, :, :T].normal_()
        cache.values[:, :, :T].normal_()
        cache.length = T

        def rewind():
            cache.length = T
        full.append(min(time_median_ms(lambda: full_attn.decode_step(x_t, cache), device=DEVICE, setup=rewind)
                        for _ in range(2)))
        kv.append(2 * BENCH_BATCH * T * BENCH_DIM * BYTES_PER_ELEMENT)

        held = {"state": lin_attn.init_state(BENCH_BATCH, device=DEVICE)}
        for _ in range(4):
            held["state"] = lin_attn.step(torch.randn_like(x_t), held["state"])[1]

        def step():
            held["state"] = lin_attn.step(x_t, held["state"])[1]
        linear.append(min(time_median_ms(step, device=DEVICE) for _ in range(2)))
        lin.append(BENCH_BATCH * (BENCH_HEADS * head_dim ** 2 + BENCH_HEADS * head_dim) * BYTES_PER_ELEMENT)
    return {"full_ms_per_step": full, "linear_ms_per_step": linear, "kv_cache_bytes": kv, "linear_state_bytes": lin}
