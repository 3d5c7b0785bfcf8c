# Every batch drawn before training; the loss from log-probabilities gathered at the answers;
# accuracy counted row by row in Python.
def train_recall(pattern, config, budget, seed=0):
    torch.manual_seed(seed)
    model = HybridTransformerLM(RECALL_VOCAB_SIZE, config["embedding_dim"], pattern, config["num_heads"],
                                max_seq_len=RECALL_SEQ_LEN, embedding_std=RECALL_EMBEDDING_STD).to(DEVICE)
    generator = torch.Generator().manual_seed(seed)
    batches = [recall_batch(budget["batch_size"], generator)[:2] for _ in range(budget["steps"])]
    optimizer, schedule = make_optimizer(model, lr=budget["lr"], total_steps=budget["steps"])
    for tokens, answers in batches:
        log_probs = torch.log_softmax(model(tokens)[:, -RECALL_NUM_PAIRS:], dim=-1)
        loss = -log_probs.gather(-1, answers[..., None]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model


def recall_accuracy(model, tokens, answers, distances):
    with torch.no_grad():
        guesses = model(tokens).argmax(dim=-1)[:, -RECALL_NUM_PAIRS:].tolist()
    right = {d: [] for d in range(1, RECALL_NUM_PAIRS + 1)}
    for row_guesses, row_answers, row_distances in zip(guesses, answers.tolist(), distances.tolist()):
        for guess, answer, distance in zip(row_guesses, row_answers, row_distances):
            right[distance].append(guess == answer)
    every = [r for d in right for r in right[d]]
    return {"accuracy": [sum(right[d]) / len(right[d]) for d in sorted(right)],
            "overall_accuracy": sum(every) / len(every)}
