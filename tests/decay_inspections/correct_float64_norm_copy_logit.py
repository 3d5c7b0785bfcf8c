# The norm taken in float64 with torch.linalg.norm, the logit copied in, the layers found by type.
def state_norms(layer, inputs, logits):
    out = {}
    with torch.no_grad():
        for label, value in logits.items():
            layer.gamma_logit.copy_(torch.full_like(layer.gamma_logit, value))
            state, norms = None, []
            for t in range(inputs.shape[1]):
                _, state = layer.step(inputs[:, t], state)
                norms.append(float(torch.linalg.norm(state[0].double())))
            out[label] = norms
    return out


def learned_decays(models):
    return {name: [torch.sigmoid(block.attn.gamma_logit).tolist() for block in model.blocks
                   if isinstance(block.attn, LinearAttention)]
            for name, model in models.items()}
