# The loss over every position with the pairs' targets ignored (ignore_index), torch's own AdamW;
# accuracy with scatter_add over distances.
def train_recall(pattern, config, budget, seed=0):
    torch.manual_seed(seed)
    model = HybridTransformerLM(RECALL_VOCAB_SIZE, config["embedding_dim"], pattern, config["num_heads"],
                                max_seq_len=RECALL_SEQ_LEN, embedding_std=RECALL_EMBEDDING_STD)
    optimizer = torch.optim.AdamW(model.parameters(), lr=budget["lr"])
    generator = torch.Generator()
    generator.manual_seed(seed)
    for _ in range(budget["steps"]):
        tokens, answers, _ = recall_batch(budget["batch_size"], generator)
        targets = torch.full_like(tokens, -100)
        targets[:, 2 * RECALL_NUM_PAIRS:] = answers
        logits = model.forward(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def recall_accuracy(model, tokens, answers, distances):
    with torch.no_grad():
        predicted = model(tokens)[:, 2 * RECALL_NUM_PAIRS:].argmax(-1)
    hits = (predicted == answers).double().reshape(-1)
    buckets = (distances - 1).reshape(-1)
    totals = torch.zeros(RECALL_NUM_PAIRS, dtype=torch.float64).scatter_add_(0, buckets, hits)
    counts = torch.zeros(RECALL_NUM_PAIRS, dtype=torch.float64).scatter_add_(0, buckets, torch.ones_like(hits))
    return {"accuracy": (totals / counts).tolist(), "overall_accuracy": hits.mean().item()}
