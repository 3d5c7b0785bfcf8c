# The state returned by step is dropped: every token is stepped from None, so each norm is that
# of one token's write.
def state_norms(layer, inputs, logits):
    out = {}
    with torch.no_grad():
        for label, value in logits.items():
            layer.gamma_logit.fill_(value)
            state, norms = None, []
            for t in range(inputs.shape[1]):
                _, new_state = layer.step(inputs[:, t], state)
                norms.append(new_state[0].norm().item())
            out[label] = norms
    return out


def learned_decays(models):
    return {name: [block.attn.decay.detach().tolist() for block in model.blocks if block.kind == "linear"]
            for name, model in models.items()}
