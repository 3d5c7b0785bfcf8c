# The seed passed on as a keyword, the evaluation batches seeded differently from the training
# ones (still the held-out split), the counts read from named_parameters.
def train_and_compare(config, budget, seed=0):
    results, models = {}, {}
    for name in ("all_full", "all_linear", "hybrid_LLLF"):
        torch.manual_seed(seed)
        model = HybridTransformerLM(tokenizer.vocab_size, config["embedding_dim"], LAYER_PATTERNS[name],
                                    config["num_heads"], max_seq_len=budget["context"],
                                    hidden_dim=config["hidden_dim"])
        train_lm(model, train_ids, steps=budget["steps"], batch_size=budget["batch_size"],
                 context=budget["context"], seed=seed, lr=1e-3)
        val_loss = evaluate_loss(model, val_ids, batch_size=budget["batch_size"], context=budget["context"],
                                 num_batches=budget["eval_batches"], seed=seed + 99)
        count = sum(t.numel() for _, t in model.named_parameters())
        results[name] = {"parameters": count, "val_loss": val_loss,
                         "sample": generate_text(model, tokenizer, SAMPLE_PROMPT,
                                                 max_new_tokens=budget["sample_tokens"], seed=seed)}
        models[name] = model
    return results, models
