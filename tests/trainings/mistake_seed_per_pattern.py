# Each pattern trained with its own seed: the three models see different batches.
def train_and_compare(config, budget, seed=0):
    models = {}
    for name, pattern in LAYER_PATTERNS.items():
        torch.manual_seed(seed)
        models[name] = HybridTransformerLM(tokenizer.vocab_size, config["embedding_dim"], pattern,
                                           config["num_heads"], max_seq_len=budget["context"],
                                           hidden_dim=config["hidden_dim"]).to(DEVICE)
    for offset, model in enumerate(models.values()):
        train_lm(model, train_ids, steps=budget["steps"], batch_size=budget["batch_size"],
                 context=budget["context"], seed=seed + offset)
    results = {}
    for name, model in models.items():
        results[name] = {
            "parameters": int(model.num_parameters()),
            "val_loss": evaluate_loss(model, val_ids, batch_size=budget["batch_size"], context=budget["context"],
                                      num_batches=budget["eval_batches"]),
            "sample": generate_text(model, tokenizer, SAMPLE_PROMPT, max_new_tokens=budget["sample_tokens"]),
        }
    return results, models
