# train_lm called once per step (steps=1): each call builds a new optimizer and schedule and
# seeds a new generator, so every step trains on the seed's first batch again, with the
# schedule's warmup restarted. The patterns still see the same batches as each other.
def train_and_compare(config, budget, seed=0):
    results, models = {}, {}
    for name, pattern in LAYER_PATTERNS.items():
        torch.manual_seed(seed)
        model = HybridTransformerLM(tokenizer.vocab_size, config["embedding_dim"], pattern, config["num_heads"],
                                    max_seq_len=budget["context"], hidden_dim=config["hidden_dim"])
        for _ in range(budget["steps"]):
            train_lm(model, train_ids, steps=1, batch_size=budget["batch_size"], context=budget["context"],
                     seed=seed)
        val = evaluate_loss(model, val_ids, batch_size=budget["batch_size"], context=budget["context"],
                            num_batches=budget["eval_batches"])
        results[name] = {"parameters": int(model.num_parameters()), "val_loss": float(val),
                         "sample": generate_text(model, tokenizer, SAMPLE_PROMPT,
                                                 max_new_tokens=budget["sample_tokens"])}
        models[name] = model
    return results, models
