"""Speech: audio reading and features against the libraries' references, the listeners' time reduction and
masking, cached decoding against teacher forcing, the digit-string generator's splits, and a tiny LAS trained on
real FSDD strings that transcribes unseen recordings far better than chance."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile
import torch

from attnkit.config import ExperimentConfig
from attnkit.data.audio import AudioSettings, log_mel, read_audio
from attnkit.data.speech import digit_strings, fsdd_recordings, split_recordings
from attnkit.errors import AttnkitError
from attnkit.models.las import LAS, LASConfig
from attnkit.models.speech_transformer import SpeechTransformer, SpeechTransformerConfig
from attnkit.nn.audio import Frames, pad_frames
from attnkit.tokens import BOS, EOS, PAD

RATE = 8000


def tone(freq: float, seconds: float = 0.5, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int = RATE, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt)
    return buf.getvalue()


# --- features and reading


def test_log_mel_equals_librosa_melspectrogram():
    import librosa

    wave = np.random.default_rng(0).standard_normal(RATE * 2).astype(np.float32) * 0.1
    ours = log_mel(wave, RATE, 40).numpy()
    ref = librosa.feature.melspectrogram(y=wave, sr=RATE, n_fft=256, hop_length=80, win_length=200, n_mels=40,
                                         power=2.0, center=True, pad_mode="constant")
    np.testing.assert_allclose(ours, np.log(ref + 1e-6).T, atol=1e-4)
    assert ours.shape == (RATE * 2 // 80 + 1, 40)


def test_other_rates_are_resampled_and_stereo_down_mixed(tmp_path):
    settings = AudioSettings(rate=RATE, n_mels=40)
    stereo = np.stack([tone(1000, rate=16000), tone(1000, rate=16000)], 1)
    path = tmp_path / "a.flac"
    soundfile.write(path, stereo, 16000)
    wave = read_audio(path, settings)
    assert wave.ndim == 1 and abs(wave.size - RATE // 2) <= 2
    spectrum = np.abs(np.fft.rfft(wave))
    assert abs(np.argmax(spectrum) * RATE / wave.size - 1000) < 5  # the tone is where it was
    np.testing.assert_allclose(read_audio((tone(1000), RATE), settings), tone(1000))


@pytest.mark.parametrize("data, message", [
    (b"", "empty file"),
    (b"this is plain text, not a sound" * 20, "not an audio file"),
    (wav_bytes(np.zeros(RATE, np.float32)), "silent"),
    (wav_bytes(tone(440))[:3000], "truncated WAV"),
    (wav_bytes(tone(440, rate=4000), rate=4000), "below the 8000 Hz"),
    (wav_bytes(tone(440, seconds=3.0)), "longer than the limit of 2 s"),
])
def test_bad_audio_is_one_line_naming_the_file(tmp_path, data, message):
    path = tmp_path / "bad.wav"
    path.write_bytes(data)
    with pytest.raises(AttnkitError) as e:
        read_audio(path, AudioSettings(rate=RATE, n_mels=40, max_seconds=2.0))
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


# --- the digit strings


def test_digit_strings_are_deterministic_and_never_mix_splits():
    recordings = fsdd_recordings()
    assert len(recordings) == 2500
    train, test = split_recordings(recordings, "train"), split_recordings(recordings, "test")
    assert {r.index for r in train} == set(range(10, 50)) and {r.index for r in test} == set(range(5))
    assert not {r.path for r in train} & {r.path for r in test}
    a, b = (digit_strings(test, 20, seed=0, split="test") for _ in range(2))
    assert a.transcripts == b.transcripts and all(np.array_equal(x[0], y[0]) for x, y in zip(a.audio, b.audio))
    for t in a.transcripts:
        assert 1 <= len(t.split()) <= 10 and all(d.isdigit() for d in t.split())
    # a string of one recording holds it (plus silence and light noise): its samples correlate with the file's
    one = digit_strings([test[0]], 1, seed=3, split="test")
    assert one.transcripts[0].split() == [str(test[0].digit)] * len(one.transcripts[0].split())
    held = split_recordings(recordings, "test", held_out="theo")
    assert {r.speaker for r in held} == {"theo"} and len(held) == 500
    assert "theo" not in {r.speaker for r in split_recordings(recordings, "train", held_out="theo")}


# --- the models


def las(seed: int = 0, **kw) -> LAS:
    torch.manual_seed(seed)
    cfg = LASConfig(listener_size=16, speller_size=24, embedding_size=8, attention_size=16, dropout=0.0, **kw)
    return LAS(cfg, 20, 15).eval()


def speech_transformer(seed: int = 0) -> SpeechTransformer:
    torch.manual_seed(seed)
    cfg = SpeechTransformerConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                                  conv_channels=4, dropout=0.0)
    return SpeechTransformer(cfg, 20, 15).eval()


def random_frames(lengths: list[int], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 20, generator=g) for n in lengths]


@pytest.mark.parametrize("frames", [64, 67, 200, 8])
def test_listener_halves_time_per_layer(frames):
    model = las()
    memory = model.encode(pad_frames(random_frames([frames])))
    assert memory.states.size(1) == max(1, frames // 8) == int(model.memory_lengths(torch.tensor([frames]))[0])
    for layers in (1, 2):
        m = las(pyramid_layers=layers)
        assert m.encode(pad_frames(random_frames([frames]))).states.size(1) == max(1, frames // 2 ** layers)


@pytest.mark.parametrize("make", [las, speech_transformer])
@torch.no_grad()
def test_padding_never_changes_what_a_row_hears_or_spells(make):
    model = make()
    utterances = random_frames([37, 120, 81], seed=1)
    batch = pad_frames(utterances)
    tgt_in = torch.tensor([[BOS, 5, 6, 7]] * 3)
    together = model(batch, tgt_in, need_weights=True)
    for i, f in enumerate(utterances):
        alone = model(pad_frames([f]), tgt_in[:1], need_weights=True)
        torch.testing.assert_close(together.logits[i], alone.logits[0], atol=1e-5, rtol=1e-5)
        n = int(model.memory_lengths(torch.tensor([f.size(0)]))[0])
        cross = together.attention.cross[-1][i]  # [H, T, U]
        torch.testing.assert_close(cross[..., :n], alone.attention.cross[-1][0], atol=1e-5, rtol=1e-5)
        assert float(cross[..., n:].abs().sum()) == 0.0  # no weight on padding
        torch.testing.assert_close(cross.sum(-1), torch.ones(cross.shape[:-1]))  # each step's weights sum to one


def test_the_joint_ctc_loss_mixes_the_attention_loss_with_torchs_ctc_over_the_encoder_frames():
    """``ctc_weight`` w: the loss is (1 - w) times the attention loss of the same weights without CTC plus w times
    CTC's -log p(y | x) of the characters (EOS and padding not among them), computed here by torch's ctc_loss one
    utterance at a time over the model's own encoder frames and CTC layer; so padding changes nothing, and w = 0
    builds no CTC layer."""
    torch.manual_seed(0)
    cfg = SpeechTransformerConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=1,
                                  conv_channels=4, dropout=0.0, ctc_weight=0.3)
    joint = SpeechTransformer(cfg, 20, 15).eval()
    plain = SpeechTransformer(dataclasses.replace(cfg, ctc_weight=0.0), 20, 15).eval()
    assert plain.ctc_output is None
    plain.load_state_dict({k: v for k, v in joint.state_dict().items() if not k.startswith("ctc_output")})
    utterances = random_frames([90, 61, 120], seed=3)
    characters = [[5, 6, 5, 9], [7, 4], [8, 8, 6, 4, 10]]
    width = max(map(len, characters)) + 1
    tgt_in = torch.tensor([[BOS, *c] + [PAD] * (width - 1 - len(c)) for c in characters])
    targets = torch.tensor([[*c, EOS] + [PAD] * (width - 1 - len(c)) for c in characters])
    batch = pad_frames(utterances)
    loss = joint(batch, tgt_in, targets).loss
    attention = plain(batch, tgt_in, targets).loss
    ctc = 0.0
    for f, c in zip(utterances, characters):
        memory = joint.encode(pad_frames([f]))
        log_probs = joint.ctc_output(memory.states).log_softmax(-1)[0]  # [U, V]
        ctc += float(torch.nn.functional.ctc_loss(log_probs[:, None], torch.tensor([c]),
                                                  torch.tensor([log_probs.size(0)]), torch.tensor([len(c)]),
                                                  blank=PAD, reduction="sum"))
    assert float(loss) == pytest.approx(0.7 * float(attention) + 0.3 * ctc, rel=1e-5)
    loss.backward()
    assert joint.ctc_output.weight.grad.abs().sum() > 0 and joint.subsample.proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("make", [las, speech_transformer])
def test_cached_decoding_equals_teacher_forcing(make):
    model = make()
    frames = pad_frames(random_frames([90, 61], seed=2))
    tokens = torch.tensor([[BOS, 6, 5, 9, 4], [BOS, 7, 7, 4, 8]])
    logits = model(frames, tokens).logits.log_softmax(-1)
    state = model.init_state(model.encode(frames))
    for t in range(tokens.size(1)):
        log_probs, state, attention = model.step(tokens[:, t], state, need_weights=True)
        torch.testing.assert_close(log_probs, logits[:, t], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attention.sum(-1), torch.ones(2))


# --- a tiny LAS trained on real FSDD strings


@pytest.fixture(scope="module")
def tiny_las_run(tmp_path_factory):
    from attnkit.train import Trainer
    from attnkit.train.speech import SpeechTask

    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("las_run")
    cfg = ExperimentConfig(name="tiny_las")
    cfg.model = LASConfig(listener_size=48, speller_size=64, embedding_size=16, attention_size=32, dropout=0.0)
    cfg.data = dataclasses.replace(cfg.data, format="fsdd_digits", n_mels=20, freq_masks=0, time_masks=0,
                                   max_audio_seconds=10.0)
    cfg.train = dataclasses.replace(cfg.train, seed=1, max_tokens=3000, max_steps=240, lr=3e-3, warmup_steps=10,
                                    schedule="constant", label_smoothing=0.0, log_every=1000, eval_every=0,
                                    eval_bleu=False, save_every=240, progress=False, threads=1, eps=1e-8)
    cfg.decode = dataclasses.replace(cfg.decode, beam_size=1)
    recordings = [r for r in fsdd_recordings() if r.speaker in ("jackson", "george")]
    train = digit_strings(split_recordings(recordings, "train"), 300, 0, "train", max_digits=2)
    test = digit_strings(split_recordings(recordings, "test"), 40, 0, "test", max_digits=2)
    task = SpeechTask(cfg, run, splits={"train": train, "valid": test})
    Trainer(cfg, run, task=task).train()
    return run, test


def test_tiny_las_transcribes_unseen_recordings_far_better_than_chance(tiny_las_run, tmp_path):
    import attnkit
    from attnkit.evaluate.speech import speech_scores

    run, test = tiny_las_run
    model = attnkit.load(run)
    hyps = model.transcribe(test.audio)
    scores = speech_scores(hyps, test.transcripts)
    # chance: a digit right one time in ten, so a CER near 90% even with the lengths right
    assert scores["cer"] < 50, (scores, hyps[:5], test.transcripts[:5])
    one = model.transcribe(test.audio[0], details=True)
    attention = one.hypotheses[0].attention
    assert attention.shape == (len(one.hypotheses[0].tokens) + 1, one.memory_frames)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.size(0)))
    # joint CTC/attention decoding needs a CTC layer, which LAS has not: one line naming the checkpoint
    with pytest.raises(AttnkitError, match=rf"^{run}.*: decode.ctc_weight = 0.3 needs a model trained with joint CTC"):
        model.transcribe(test.audio[0], ctc_weight=0.3)


def test_cli_transcribe_and_evaluate(tiny_las_run, tmp_path):
    run, test = tiny_las_run
    lines = []
    for i, (samples, rate) in enumerate(test.audio[:4]):
        path = tmp_path / f"u{i}.{'flac' if i % 2 else 'wav'}"
        soundfile.write(path, samples, rate)
        lines.append(f"{path.name}\t{test.transcripts[i]}")
    (tmp_path / "list.tsv").write_text("\n".join(lines) + "\n")
    cli = [sys.executable, "-m", "attnkit"]
    out = subprocess.run(cli + ["transcribe", "--checkpoint", str(run), "--show-attention", str(tmp_path / "att"),
                                *(str(tmp_path / f"u{i}.{'flac' if i % 2 else 'wav'}") for i in range(4))],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import attnkit

    expected = attnkit.load(run).transcribe([tmp_path / f"u{i}.{'flac' if i % 2 else 'wav'}" for i in range(4)])
    assert out.stdout.splitlines() == expected
    assert len(list((tmp_path / "att").glob("*.png"))) == 4
    ev = subprocess.run(cli + ["evaluate", "--checkpoint", str(run), "--data", str(tmp_path / "list.tsv")],
                        capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0, ev.stderr
    scores = json.loads(ev.stdout)
    assert {"cer", "wer", "string_accuracy"} <= set(scores) and 0 <= scores["cer"] <= 100
    bad = subprocess.run(cli + ["transcribe", "--checkpoint", str(run), str(tmp_path / "list.tsv")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "list.tsv" in bad.stderr


def test_frames_reorder_like_a_tensor():
    f = pad_frames(random_frames([5, 9]))
    picked = f.index_select(0, torch.tensor([1, 1, 0]))
    assert isinstance(picked, Frames) and picked.lengths.tolist() == [9, 9, 5] and picked.size(0) == 3
