# The logits shifted one position as in language modelling: the loss scores the last value of
# the pairs and every query but the last, each against the answer of the next query.

def train_recall(pattern, config, budget, seed=0):
    torch.manual_seed(seed)
    model = HybridTransformerLM(RECALL_VOCAB_SIZE, config["embedding_dim"], pattern, config["num_heads"],
                                max_seq_len=RECALL_SEQ_LEN, embedding_std=RECALL_EMBEDDING_STD).to(DEVICE)
    optimizer, schedule = make_optimizer(model, lr=budget["lr"], total_steps=budget["steps"])
    generator = torch.Generator().manual_seed(seed)
    for step in range(budget["steps"]):
        tokens, answers, _ = recall_batch(budget["batch_size"], generator)
        logits = model(tokens.to(DEVICE))[:, -RECALL_NUM_PAIRS - 1:-1]  # shifted as for next-token prediction
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
