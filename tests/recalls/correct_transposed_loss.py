# cross_entropy on (B, V, P) logits, gradient clipping, an evaluation in mini-batches of rows,
# with numpy for the counting.
import numpy as np


def train_recall(pattern, config, budget, seed=0):
    torch.manual_seed(seed)
    model = HybridTransformerLM(RECALL_VOCAB_SIZE, config["embedding_dim"], pattern, config["num_heads"],
                                max_seq_len=RECALL_SEQ_LEN, embedding_std=RECALL_EMBEDDING_STD).to(DEVICE)
    optimizer, schedule = make_optimizer(model, lr=budget["lr"], total_steps=budget["steps"])
    generator = torch.Generator().manual_seed(seed)
    step = 0
    while step < budget["steps"]:
        tokens, answers, _ = recall_batch(budget["batch_size"], generator)
        logits = model(tokens.to(DEVICE))
        loss = F.cross_entropy(logits[:, -RECALL_NUM_PAIRS:].transpose(1, 2), answers.to(DEVICE))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
    return model


def recall_accuracy(model, tokens, answers, distances, chunk=7):
    predictions = []
    with torch.no_grad():
        for start in range(0, tokens.shape[0], chunk):
            logits = model(tokens[start:start + chunk].to(DEVICE))
            predictions.append(logits[:, -RECALL_NUM_PAIRS:].argmax(dim=-1).cpu().numpy())
    correct = np.concatenate(predictions) == answers.numpy()
    d = distances.numpy()
    return {"accuracy": [float(correct[d == k].mean()) for k in range(1, RECALL_NUM_PAIRS + 1)],
            "overall_accuracy": float(correct.mean())}
