# The logit replaced by a new tensor rather than filled in place; the norm over S flattened.
def state_norms(layer, inputs, logits):
    norms = {}
    with torch.no_grad():
        for label, value in logits.items():
            layer.gamma_logit = torch.full((layer.num_heads,), float(value))
            state = None
            norms[label] = []
            for t in range(inputs.shape[1]):
                _, state = layer.step(inputs[:, t, :], state)
                norms[label].append(state[0].flatten().norm().item())
    return norms


def learned_decays(models):
    return {name: [list(map(float, block.attn.decay.detach())) for block in model.blocks if block.kind == "linear"]
            for name, model in models.items()}
