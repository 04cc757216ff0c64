"""The factory on a GPU, side by side in one run: the trainer against a plain loop, the generator against `transformers`.

1. Training: the factory trainer (`factory.train.pretrain`: its metrics log, loss reads at log steps only, fused AdamW,
   pinned batches, the chunked cross-entropy eager and torch's, fused by the compiler, when compiled) vs a plain
   nanoGPT-style loop (the same model, batches and optimizer; bf16 autocast, the loss inside the compiled function, no
   host sync but one at the end) on a ~0.1B and a ~0.9B Llama, eager and compiled. Both are timed over the same steps
   after a warm-up, between two points where the host has waited for the GPU; tokens/s and MFU (FLOPs per token and the
   bf16 peak of `factory.devices`) side by side. Goals: >= 0.99x the plain loop in every case; >= 55% MFU on the 0.9B
   compiled case on an H100/H200.
2. Generation: the factory's generator (static cache, one CUDA graph per batch's decode step; and without graphs) vs
   `transformers`' `generate` on the same weights (the factory's Hugging Face layout), 16 prompts x 256 new tokens,
   greedy, fp32 and bf16: tokens/s and how many rows are token for token the same. Goal: >= 3x `transformers`' tokens/s,
   identical tokens in fp32.

3. Attention: `scaled_dot_product_attention`'s kernels alone (flash, cuDNN, memory-efficient), forward and backward,
   causal, bf16, on contiguous (batch, heads, time, width) inputs at the two models' training shapes. On an H100 cuDNN's
   was 1.61x flash's at the 0.9B shape, yet putting it first (`torch.nn.attention.sdpa_kernel`, set_priority) changed
   neither loop's tokens/s, eager or compiled: the models keep torch's order.

On a machine without a GPU it runs at a CPU size, eager unless `--mode compiled`, so that CI keeps it working (`--smoke`:
smaller still). Batches
are random tokens built once, in pinned host memory for both sides; models are random-initialised (seed 0). The 0.9B
case takes batch 16 on a GPU with more than 100 GB, else 8 (`--batch 16` fits an 80 GB GPU compiled: 50.7 GB at the peak;
eager takes 45 GB at batch 8).
"""

from __future__ import annotations

import argparse
import gc
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import Batch, LoaderState
from factory.devices import describe
from factory.models.build import build_model, hugging_face_layout
from factory.models.generate import generate
from factory.models.sampling import Sampling
from factory.train.distributed import World
from factory.train.pretrain import build_optimizer, lr_at, pretrain
from factory.train.utilisation import Utilisation

LOG = logging.getLogger("bench.gpu")


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One model to train, and how."""

    name: str
    model: ModelConfig
    vocab: int
    batch: int
    warmup: int
    steps: int
    """Timed steps, after `warmup` (a multiple of the log interval, so both ends are points where the host waited)."""


def llama(layers: int, width: int, heads: int, kv_heads: int, context: int) -> ModelConfig:
    return ModelConfig(arch="llama", n_layer=layers, n_head=heads, n_kv_head=kv_heads, n_embd=width, context=context,
                       positions="rotary", tie_embeddings=False)


def cases(device: torch.device, smoke: bool, batch: int | None = None) -> list[Case]:
    if device.type != "cuda":
        if smoke:
            return [Case(name="cpu-tiny", model=llama(2, 64, 4, 2, 64), vocab=512, batch=2, warmup=2, steps=2)]
        return [Case(name="cpu-small", model=llama(2, 128, 4, 2, 128), vocab=8192, batch=8, warmup=4, steps=8)]
    big_batch = batch or (16 if torch.cuda.get_device_properties(device).total_memory > 100e9 else 8)
    return [
        Case(name="0.1B", model=llama(12, 768, 12, 4, 1024), vocab=32_000, batch=16, warmup=10, steps=20),
        Case(name="0.9B", model=llama(16, 2048, 16, 16, 2048), vocab=32_000, batch=big_batch, warmup=10, steps=20),
    ]


def random_batches(case: Case, count: int, pinned: bool) -> list[Batch]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for step in range(count):
        seqs = torch.randint(0, case.vocab, (case.batch, case.model.context + 1), generator=generator)
        x, y = seqs[:, :-1].clone(), seqs[:, 1:].clone()
        if pinned:
            x, y = x.pin_memory(), y.pin_memory()
        batches.append(Batch(x=x, y=y, documents=(), state=LoaderState(slot=step + 1), real_tokens=y.numel(), global_tokens=y.numel()))
    return batches


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(case: Case, batches: list[Batch], config: PretrainConfig, device: torch.device) -> float:
    """The reference: a nanoGPT-style loop; seconds of the timed steps."""
    torch.manual_seed(0)
    model = build_model(case.model, case.vocab, 0).to(device)
    optimizer = build_optimizer(model, config)  # fused on a GPU, as the trainer's
    model.train()
    autocast = device.type == "cuda"

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    step_loss = torch.compile(loss_of) if config.compile else loss_of
    started = 0.0
    for step, batch in enumerate(batches):
        if step == case.warmup:
            synchronize(device)
            started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        optimizer.zero_grad(set_to_none=True)
        loss = step_loss(batch.x.to(device, non_blocking=True), batch.y.to(device, non_blocking=True))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
    synchronize(device)
    return time.perf_counter() - started


def factory_loop(case: Case, batches: list[Batch], config: PretrainConfig, world: World, work: Path) -> tuple[float, dict]:
    """The factory trainer; seconds of the timed steps (between the metrics rows at the warm-up's end and the last step,
    each written after the loop read the loss, so after the GPU caught up), and its last metrics row."""
    stamps: dict[int, float] = {}
    rows: list[dict] = []

    def heard(step: int, row: dict) -> None:
        stamps[step] = time.perf_counter()
        rows.append(row)

    pretrain(lambda state: iter(batches[state.slot if state else 0 :]), case.vocab, case.model, config, 0, work, LOG, on_metrics=heard,
             world=world)
    return stamps[case.warmup + case.steps] - stamps[case.warmup], rows[-1]


def peak_mb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")


def reset_peak(device: torch.device) -> None:
    """Free what the last side left (a compiled function holds its model until dynamo forgets it) and start a new peak."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def training(device: torch.device, smoke: bool, work: Path, only: str | None, mode: str | None, batch: int | None) -> None:
    world = World(gpus=1 if device.type == "cuda" else 0)
    modes = (False, True) if device.type == "cuda" else (False,)  # on the CPU, compiled only when asked (it compiles for minutes)
    modes = modes if mode is None else (mode == "compiled",)
    print(f"training on {describe(device)}: factory trainer vs plain loop, same model, batches and optimizer")
    print(f"{'model':<8} {'params':>7} {'mode':<9} {'batch':>5} {'plain tok/s':>12} {'factory tok/s':>14} {'factory / plain':>16} "
          f"{'plain MFU':>10} {'factory MFU':>12} {'row mfu':>8} {'peak GB p/f':>12}")
    for case in cases(device, smoke, batch):
        if only and case.name != only:
            continue
        batches = random_batches(case, case.warmup + case.steps, pinned=device.type == "cuda")
        tokens = case.steps * case.batch * case.model.context
        model = build_model(case.model, case.vocab, 0)
        utilisation = Utilisation.of(model, case.model, world, LOG)
        params = sum(p.numel() for p in model.parameters())
        del model
        for compiled in modes:
            config = PretrainConfig(steps=case.warmup + case.steps, batch_size=case.batch, lr=3e-4, warmup_steps=2, log_every=case.warmup,
                                    checkpoint_every=0, keep_last=1, keep_best_by=None, compile=compiled, precision="auto")
            if case.steps % case.warmup:
                raise ValueError("the timed steps must be a multiple of the warm-up (the log interval)")
            reset_peak(device)
            plain = plain_loop(case, batches, config, device)
            plain_peak = peak_mb(device)
            reset_peak(device)
            ours, row = factory_loop(case, batches, config, world, work / f"{case.name}-{compiled}")
            ours_peak = peak_mb(device)

            def mfu(seconds: float) -> str:
                figures = utilisation.row(tokens / seconds)
                return f"{100 * figures['mfu']:.1f}%" if "mfu" in figures else "-"

            print(f"{case.name:<8} {params / 1e9:>6.2f}B {'compiled' if compiled else 'eager':<9} {case.batch:>5} {tokens / plain:>12,.0f} "
                  f"{tokens / ours:>14,.0f} {plain / ours:>15.3f}x {mfu(plain):>10} {mfu(ours):>12} "
                  f"{100 * row['mfu'] if 'mfu' in row else float('nan'):>7.1f}% {plain_peak / 1024:>5.1f}/{ours_peak / 1024:<5.1f}")
    print("goals: factory / plain >= 0.99x in every case; >= 55% MFU on the 0.9B compiled case (H100/H200)")


def hugging_face_twin(model: torch.nn.Module, config: ModelConfig, vocab: int) -> torch.nn.Module:
    """`transformers`' LlamaForCausalLM holding `model`'s weights (through the factory's Hugging Face layout)."""
    import transformers

    layout = hugging_face_layout(config, model.state_dict(), vocab)
    assert not isinstance(layout, str), layout
    settings = {key: value for key, value in layout.config.items() if key != "model_type"}
    settings.update(bos_token_id=None, eos_token_id=None, pad_token_id=0)  # no token ends a row: every row writes all its tokens
    twin = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings))
    twin.load_state_dict({name: tensor.clone() for name, tensor in layout.tensors.items()}, strict=True)
    twin.generation_config.eos_token_id = None
    twin.generation_config.bos_token_id = None
    twin.generation_config.pad_token_id = 0
    return twin


def timed(run: Callable[[], list[list[int]]], device: torch.device) -> tuple[float, list[list[int]]]:
    synchronize(device)
    started = time.perf_counter()
    out = run()
    synchronize(device)
    return time.perf_counter() - started, out


def generation(device: torch.device, smoke: bool) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("generation: transformers is not installed here; skipped")
        return
    on_gpu = device.type == "cuda"
    config = llama(12, 768, 12, 4, 1024) if on_gpu else llama(2, 64, 4, 2, 128)
    vocab, rows, prompt, new = (32_000, 16, 64, 256) if on_gpu else (512, 4, 8, 4 if smoke else 32)
    prompts = torch.randint(0, vocab, (rows, prompt), generator=torch.Generator().manual_seed(1))
    dtypes = (torch.float32, torch.bfloat16) if on_gpu else (torch.float32,)
    print(f"generation on {describe(device)}: {rows} prompts x {prompt} tokens, {new} new tokens, greedy, "
          f"{sum(p.numel() for p in build_model(config, vocab, 0).parameters()) / 1e6:.0f}M-parameter Llama")
    print(f"{'dtype':<9} {'transformers tok/s':>19} {'factory tok/s':>14} {'no graphs tok/s':>16} {'factory / transformers':>23} "
          f"{'same rows':>10} {'same rows, no graphs':>21}")
    for dtype in dtypes:
        model = build_model(config, vocab, 0).to(device=device, dtype=dtype).eval()
        twin = hugging_face_twin(model, config, vocab).to(device=device, dtype=dtype).eval()
        ids = prompts.to(device)

        def theirs(count: int = new) -> list[list[int]]:
            with torch.no_grad():
                out = twin.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=count, do_sample=False)
            return out[:, prompt:].tolist()

        def ours(count: int = new, graphs: bool | None = None) -> list[list[int]]:
            done = generate(model, prompts.tolist(), Sampling(new_tokens=count), context=config.context, batch_size=rows, graphs=graphs)
            return [list(c.tokens) for c in done]

        theirs(4), ours(4), ours(4, graphs=False)  # warm-up, untimed
        their_s, their_tokens = timed(theirs, device)
        our_s, our_tokens = timed(ours, device)
        plain_s, plain_tokens = timed(lambda: ours(graphs=False), device)
        total = rows * new
        same = sum(a == b for a, b in zip(our_tokens, their_tokens, strict=True))
        same_plain = sum(a == b for a, b in zip(plain_tokens, their_tokens, strict=True))
        print(f"{str(dtype).removeprefix('torch.'):<9} {total / their_s:>19,.0f} {total / our_s:>14,.0f} {total / plain_s:>16,.0f} "
              f"{their_s / our_s:>22.2f}x {same:>6}/{rows:<3} {same_plain:>17}/{rows:<3}")
        if dtype == torch.float32:
            uneven = [prompts[i, : 1 + (i * 7) % prompt].tolist() for i in range(rows)]  # left padding in one batch
            static, grown = (generate(model, uneven, Sampling(new_tokens=32), context=config.context, batch_size=rows, graphs=graphs)
                             for graphs in (None, False))
            print(f"{'':<9} prompts of {len(set(map(len, uneven)))} lengths in one batch: the same greedy tokens with and without graphs: "
                  f"{sum(a.tokens == b.tokens for a, b in zip(static, grown, strict=True))}/{rows}")
            drawn = [generate(model, prompts.tolist(), Sampling(new_tokens=16, temperature=0.8, top_p=0.95), context=config.context,
                              seeds=list(range(rows)))[0].tokens for _ in range(2)]
            print(f"{'':<9} sampling on {device.type} with seeds (16 tokens, T 0.8, top-p 0.95): the same draws twice: "
                  f"{'yes' if drawn[0] == drawn[1] else 'NO'}")
        del model, twin
    print("goals: factory / transformers >= 3x; every row the same in fp32")


def attention(device: torch.device, smoke: bool, batch: int | None) -> None:
    """Each attention kernel alone, forward and backward, at the training shapes: milliseconds and the ratio to flash's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION") if device.type == "cuda" else ("FLASH_ATTENTION", "MATH")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"attention on {describe(device)}: causal, {dtype}, forward + backward, ms per call (ratio: flash / kernel)")
    for case in cases(device, smoke, batch):
        heads, width = case.model.n_head, case.model.n_embd // case.model.n_head
        shape = (case.batch, heads, case.model.context, width)
        qkv = [torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]
        figures: dict[str, float] = {}
        for name in kernels:
            try:
                with sdpa_kernel(getattr(SDPBackend, name)):
                    def call() -> None:
                        F.scaled_dot_product_attention(*qkv, is_causal=True).sum().backward()

                    for _ in range(3):
                        call()
                    synchronize(device)
                    started = time.perf_counter()
                    for _ in range(10):
                        call()
                    synchronize(device)
                    figures[name] = (time.perf_counter() - started) / 10 * 1e3
            except RuntimeError as e:  # a kernel that does not take these inputs here
                print(f"{case.name:<8} {name:<20} not usable: {str(e).splitlines()[0][:100]}")
        base = figures.get("FLASH_ATTENTION")
        for name, ms in figures.items():
            print(f"{case.name:<8} {str(shape):<22} {name:<20} {ms:>9.2f} ms {base / ms if base else float('nan'):>6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the CPU size, smaller: checks the bench runs")
    parser.add_argument("--part", choices=("training", "generation", "attention"), help="run one part only")
    parser.add_argument("--batch", type=int, help="the 0.9B case's batch on a GPU (default: 16 with more than 100 GB, else 8)")
    parser.add_argument("--case", help="train one case only (0.1B, 0.9B)")
    parser.add_argument("--mode", choices=("eager", "compiled"), help="train in one mode only")
    args = parser.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        if args.part in (None, "attention"):
            attention(device, args.smoke, args.batch)
        if args.part in (None, "training"):
            training(device, args.smoke, Path(tmp), args.case, args.mode, args.batch)
        if args.part in (None, "generation"):
            generation(device, args.smoke)


if __name__ == "__main__":
    main()
