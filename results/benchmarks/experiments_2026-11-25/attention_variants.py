"""One decode attention call of the default model, SDPA variants timed (README.md beside this file)."""
import torch, time, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.set_num_threads(1)
import sys; sys.path.insert(0,'.')
from benchmarks import decode as dc
m = dc.build_model(320); c = m.config
print(c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size, c.num_hidden_layers)
rows, kvh, g, d, cap, span = 64, c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim, 512, 190
K = torch.randn(rows, kvh, cap, d); V = torch.randn(rows, kvh, cap, d)
q = torch.randn(rows, kvh, g, d)
slots = torch.randint(100, span, (rows,))
mask = (torch.arange(span)[None] <= slots[:, None])[:, None, None]
k, v = K[:, :, :span], V[:, :, :span]
def t(f, n=200):
    f(); s=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-s)/n*1e6
def manual():
    s = torch.matmul(q, k.transpose(-1, -2)) * d**-0.5
    s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)
def manual_baddbmm():
    s = torch.matmul(q, k.transpose(-1, -2))
    s = torch.where(mask, s, float("-inf"))
    return torch.matmul(torch.softmax(s * d**-0.5, -1), v)
ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
print("default", t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
with sdpa_kernel(SDPBackend.MATH):
    print("math", t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
print("manual", t(manual), (manual()-ref).abs().max().item())
kc, vc = k.contiguous(), v.contiguous()
print("default contiguous", t(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)))
fm = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
print("default float mask", t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=fm)))
qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
print("bf16 sdpa", t(lambda: F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)))
print("bf16 sdpa incl casts", t(lambda: F.scaled_dot_product_attention(q.bfloat16(), kb, vb, attn_mask=mask).float()))
