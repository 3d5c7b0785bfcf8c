# Batches from torch's global generator, which building the model used first: each pattern's
# model draws a different share of it, so each sees other batches.

def train_recall(pattern, config, budget, seed=0):
    torch.manual_seed(seed)
    model = HybridTransformerLM(RECALL_VOCAB_SIZE, config["embedding_dim"], pattern, config["num_heads"],
                                max_seq_len=RECALL_SEQ_LEN, embedding_std=RECALL_EMBEDDING_STD).to(DEVICE)
    optimizer, schedule = make_optimizer(model, lr=budget["lr"], total_steps=budget["steps"])
    generator = None  # the global generator, seeded above
    for step in range(budget["steps"]):
        tokens, answers, _ = recall_batch(budget["batch_size"], generator)
        logits = model(tokens.to(DEVICE))[:, -RECALL_NUM_PAIRS:]
        loss = F.cross_entropy(logits.reshape(-1, RECALL_VOCAB_SIZE), answers.to(DEVICE).reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return model


def recall_accuracy(model, tokens, answers, distances):
    with torch.no_grad():
        predictions = model(tokens.to(DEVICE))[:, -RECALL_NUM_PAIRS:].argmax(dim=-1).cpu()
    correct = (predictions == answers).float()
    return {"accuracy": [correct[distances == d].mean().item() for d in range(1, RECALL_NUM_PAIRS + 1)],
            "overall_accuracy": correct.mean().item()}
