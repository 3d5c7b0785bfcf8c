# Every full-attention length first, then the linear step once per length from one saved state
# (not carried: each call starts from the same state, which costs the same), with more repeats
# than the default and a fresh token made in setup.
def decode_step_sweep(full_attn, lin_attn, history_lengths):
    result = {"full_ms_per_step": [], "linear_ms_per_step": [], "kv_cache_bytes": [], "linear_state_bytes": []}
    token = [torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)]

    def new_token():
        token[0] = torch.randn(BENCH_BATCH, BENCH_DIM, device=DEVICE, dtype=BENCH_DTYPE)
    for T in history_lengths:
        cache = full_attn.init_cache(BENCH_BATCH, capacity=T + 1, device=DEVICE)
        cache.keys[:, :, :T] = torch.randn(BENCH_BATCH, BENCH_HEADS, T, BENCH_DIM // BENCH_HEADS)
        cache.values[:, :, :T] = torch.randn(BENCH_BATCH, BENCH_HEADS, T, BENCH_DIM // BENCH_HEADS)

        def setup(cache=cache, T=T):
            cache.length = T
            new_token()
        result["full_ms_per_step"].append(
            time_median_ms(lambda cache=cache: full_attn.decode_step(token[0], cache), device=DEVICE, setup=setup,
                           repeats=30, warmup=5))
        setup()
        result["kv_cache_bytes"].append(cache.nbytes())
    saved = lin_attn.step(token[0], None)[1]
    for T in history_lengths:
        result["linear_ms_per_step"].append(
            time_median_ms(lambda: lin_attn.step(token[0], saved), device=DEVICE, setup=new_token, repeats=30))
        result["linear_state_bytes"].append(sum(t.numel() * t.element_size() for t in saved))
    return result
