# The norm of the normalizer z recorded instead of the norm of S.
def state_norms(layer, inputs, logits):
    out = {}
    with torch.no_grad():
        for label, value in logits.items():
            layer.gamma_logit.fill_(value)
            state, norms = None, []
            for t in range(inputs.shape[1]):
                _, state = layer.step(inputs[:, t], state)
                norms.append(state[1].norm().item())
            out[label] = norms
    return out


def learned_decays(models):
    return {name: [block.attn.decay.detach().tolist() for block in model.blocks if block.kind == "linear"]
            for name, model in models.items()}
