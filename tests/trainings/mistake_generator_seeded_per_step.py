# Its own loop with one optimizer, but a generator seeded with seed + step at every step: the
# patterns see the same batches as each other, yet not the seed's sequence of batches.
def train_and_compare(config, budget, seed=0):
    results, models = {}, {}
    for name, pattern in LAYER_PATTERNS.items():
        torch.manual_seed(seed)
        model = HybridTransformerLM(tokenizer.vocab_size, config["embedding_dim"], pattern, config["num_heads"],
                                    max_seq_len=budget["context"], hidden_dim=config["hidden_dim"])
        optimizer, schedule = make_optimizer(model, lr=2e-3, total_steps=budget["steps"])
        for step in range(budget["steps"]):
            inputs, targets = get_batch(train_ids, budget["batch_size"], budget["context"],
                                        torch.Generator().manual_seed(seed + step))
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
