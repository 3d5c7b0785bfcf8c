# New random tokens drawn for every setting instead of the inputs given.
def state_norms(layer, inputs, logits):
    out = {}
    with torch.no_grad():
        for label, value in logits.items():
            layer.gamma_logit.fill_(value)
            tokens = torch.randn_like(inputs)
            state, norms = None, []
            for t in range(tokens.shape[1]):
                _, state = layer.step(tokens[:, t], state)
                norms.append(state[0].norm().item())
            out[label] = norms
    return out


def learned_decays(models):
    return {name: [block.attn.decay.detach().tolist() for block in model.blocks if block.kind == "linear"]
            for name, model in models.items()}
