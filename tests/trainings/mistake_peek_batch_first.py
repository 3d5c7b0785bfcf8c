# Draws one batch to look at its shape before training, from the generator it then trains with:
# every step's batch is the seed's next draw, one out of place.
def train_and_compare(config, budget, seed=0):
    results, models = {}, {}
    for name, pattern in LAYER_PATTERNS.items():
        torch.manual_seed(seed)
        model = HybridTransformerLM(tokenizer.vocab_size, config["embedding_dim"], pattern, config["num_heads"],
                                    max_seq_len=budget["context"], hidden_dim=config["hidden_dim"])
        optimizer, schedule = make_optimizer(model, lr=2e-3, total_steps=budget["steps"])
        batches = torch.Generator().manual_seed(seed)
        peek, _ = get_batch(train_ids, budget["batch_size"], budget["context"], batches)
        assert peek.shape == (budget["batch_size"], budget["context"])
        for _ in range(budget["steps"]):
            inputs, targets = get_batch(train_ids, budget["batch_size"], budget["context"], batches)
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        val = evaluate_loss(model, val_ids, batch_size=budget["batch_size"], context=budget["context"],
                            num_batches=budget["eval_batches"])
        results[name] = {"parameters": int(model.num_parameters()), "val_loss": float(val),
                         "sample": generate_text(model, tokenizer, SAMPLE_PROMPT,
                                                 max_new_tokens=budget["sample_tokens"])}
        models[name] = model
    return results, models
