# A zero state from init_state, the norm as the root of the sum of squares, the logit written
# through .data, the linear layers collected in a loop.
def state_norms(layer, inputs, logits):
    result = {}
    for label, value in logits.items():
        layer.gamma_logit.data[:] = value
        state = layer.init_state(inputs.shape[0])
        norms = []
        with torch.no_grad():
            for token in inputs.unbind(dim=1):
                _, state = layer.step(token, state)
                S, _ = state
                norms.append(S.pow(2).sum().sqrt().item())
        result[label] = norms
    return result


def learned_decays(models):
    found = {}
    for name, model in models.items():
        rows = []
        for block in model.blocks:
            if block.kind == "linear":
                rows.append([float(g) for g in block.attn.decay.detach()])
        found[name] = rows
    return found
