# The models built at StoryLM-1M's sizes whatever config is given.
def train_and_compare(config, budget, seed=0):
    models = {}
    for name, pattern in LAYER_PATTERNS.items():
        torch.manual_seed(seed)
        models[name] = HybridTransformerLM(tokenizer.vocab_size, STORYLM_1M["embedding_dim"], pattern,
                                           STORYLM_1M["num_heads"], max_seq_len=budget["context"],
                                           hidden_dim=STORYLM_1M["hidden_dim"]).to(DEVICE)
    for model in models.values():
        train_lm(model, train_ids, steps=budget["steps"], batch_size=budget["batch_size"],
                 context=budget["context"], seed=seed)
    results = {}
    for name, model in models.items():
        results[name] = {
            "parameters": int(model.num_parameters()),
            "val_loss": evaluate_loss(model, val_ids, batch_size=budget["batch_size"], context=budget["context"],
                                      num_batches=budget["eval_batches"]),
            "sample": generate_text(model, tokenizer, SAMPLE_PROMPT, max_new_tokens=budget["sample_tokens"]),
        }
    return results, models
