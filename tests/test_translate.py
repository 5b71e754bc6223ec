import json
import os
import subprocess
import sys

import pytest
import torch

from nmt.config import ModelConfig
from nmt.score import compound_split_bleu, score, score_files, split_compounds, tokenized_bleu
from tests.conftest import ROOT


def cli(module, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_translate_keeps_one_line_per_input_line(checkpoint, tmp_path):
    lines = ["A man rides a bike.", "", "   \t ", "Zwei Hunde ☃ 漢字 \u200b e\u0301 🙂", "word " * 120,
             "A dog runs.", ""]
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for beam in (1, 4):
        result = cli("nmt.translate", f"checkpoint={checkpoint}", f"input={src}", f"output={tmp_path}/out",
                     f"beam={beam}")
        assert result.returncode == 0, result.stderr
        out = (tmp_path / "out").read_text(encoding="utf-8").split("\n")
        assert out[-1] == "" and len(out) - 1 == len(lines)
        assert out[1] == "" and out[2] == "" and out[6] == ""
        assert "truncated" not in result.stderr  # a relative model reads long inputs whole
    piped = cli("nmt.translate", f"checkpoint={checkpoint}", stdin="\n".join(lines) + "\n")
    assert piped.returncode == 0 and piped.stdout.split("\n")[:-1] == out[:-1]


@pytest.mark.slow  # tens of seconds: make test stays under 10 minutes
def test_a_line_written_into_a_pipe_is_answered_before_the_input_ends(checkpoint, tmp_path):
    """As fairseq-interactive behind another program: each line's translation is written and flushed once it has
    arrived and been decoded, not when the input ends; the lines are those of the batched run."""
    import select

    lines = ["A man rides a bike.", "Two dogs are playing in the snow.", "", "A little girl is climbing a tree."]
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    batched = cli("nmt.translate", f"checkpoint={checkpoint}", f"input={src}", "beam=4")
    assert batched.returncode == 0, batched.stderr
    job = subprocess.Popen([sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", "beam=4"], cwd=ROOT,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        answered = []
        for line in lines:  # one at a time, the pipe kept open: each answer comes before the next line is sent
            job.stdin.write(line + "\n")
            job.stdin.flush()
            ready, _, _ = select.select([job.stdout], [], [], 120)
            assert ready, f"no answer to {line!r} while the input stays open"
            answered.append(job.stdout.readline())
        job.stdin.close()
        assert job.stdout.read() == "" and job.wait(timeout=60) == 0
    finally:
        job.kill()
    assert "".join(answered) == batched.stdout


def test_only_absolute_positions_limit_the_input():
    from nmt.decoding.decode import encode_lines, input_limit
    from nmt.modeling.transformer import Transformer

    class Spaces:  # one id per word is enough for the limit
        def encode(self, lines):
            return [[5] * len(line.split()) for line in lines]

    long_line = "word " * 200
    for position, limit in (("relative", None), ("none", None), ("absolute", 80 - 50 - 1), ("both", 29), ("learned", 29)):
        model = Transformer(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=16,
                                        position=position, max_positions=80), 10)
        assert input_limit(model, 50) == limit
        assert len(encode_lines(Spaces(), [long_line], input_limit(model, 50))[0]) == (limit or 200)


def test_translate_replaces_invalid_utf8_and_names_the_line(checkpoint, tmp_path):
    raw = b"A man rides a bike.\nA dog \xff\xfe runs.\n\nTwo \xc3 cats.\n"
    for where in ("stdin", "file"):
        args = [f"checkpoint={checkpoint}"]
        if where == "file":
            (tmp_path / "bad.en").write_bytes(raw)
            args.append(f"input={tmp_path}/bad.en")
        result = subprocess.run([sys.executable, "-m", "nmt.translate", *args], cwd=ROOT, input=raw,
                                capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        stderr = result.stderr.decode()
        assert result.returncode == 0, stderr
        assert "Traceback" not in stderr
        assert ":2: invalid UTF-8" in stderr and ":4: invalid UTF-8" in stderr and ":1:" not in stderr
        out = result.stdout.decode("utf-8").split("\n")
        assert len(out) == 5 and out[-1] == "" and out[2] == ""  # one line per input line, the empty one empty
        assert all(out[i] for i in (0, 1, 3))


def test_translate_refuses_a_checkpoint_with_pickled_code(tmp_path):
    torch.save({"model": {}, "payload": tmp_path}, tmp_path / "evil.pt")
    result = cli("nmt.translate", f"checkpoint={tmp_path}/evil.pt", stdin="hello\n")
    assert result.returncode == 2
    assert "pickled Python objects" in result.stderr and "Traceback" not in result.stderr


def test_split_compounds_like_get_ende_bleu():
    # expected strings are what `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` prints for the same input
    assert split_compounds("Das E-Mail-Konto") == "Das E ##AT##-##AT## Mail ##AT##-##AT## Konto"
    assert split_compounds("high-quality , well-known") == "high ##AT##-##AT## quality , well ##AT##-##AT## known"
    assert split_compounds("a - b -- c") == "a - b -- c"
    assert split_compounds("x--y") == "x ##AT##-##AT## -y"


def test_compound_split_bleu_rewards_matching_compounds():
    refs = ["Die Hand-in-Hand Arbeit ist gut ."]
    assert compound_split_bleu(refs, refs, "de") == pytest.approx(100.0)
    assert compound_split_bleu(["Die Hand in Hand Arbeit ist gut ."], refs, "de") < 100.0


def test_only_german_targets_are_compound_split():
    """get_ende_bleu.sh's split is the English-German convention: French gets tokenized BLEU without it, under a key
    named by what it computes."""
    refs = ["Le porte-monnaie est sur la table ."]
    hyps = ["Le porte monnaie est sur la table ."]
    french = score(hyps, refs, "fr")
    assert "compound_split_bleu" not in french and french["tokenized_bleu"] == pytest.approx(
        tokenized_bleu(hyps, refs, "fr", split=False))
    assert french["tokenized_bleu"] != pytest.approx(compound_split_bleu(hyps, refs, "fr"))
    german = score(["Die Hand in Hand Arbeit ."], ["Die Hand-in-Hand Arbeit ."], "de")
    assert "tokenized_bleu" not in german
    assert german["compound_split_bleu"] == pytest.approx(
        compound_split_bleu(["Die Hand in Hand Arbeit ."], ["Die Hand-in-Hand Arbeit ."], "de"))


def test_score_agrees_with_sacrebleu_cli(tmp_path):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\nEine Frau liest.\n", encoding="utf-8")
    ref.write_text("Ein Mann fährt ein Fahrrad.\nZwei Hunde spielen im Schnee.\nEine Frau liest ein Buch.\n",
                   encoding="utf-8")
    cli_score = subprocess.run([sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-b"],
                               capture_output=True, text=True, check=True).stdout.strip()
    ours = score_files(hyp, ref, "de")
    assert f"{ours['bleu']:.1f}" == cli_score
    result = cli("nmt.score", f"hyp={hyp}", f"ref={ref}", f"output={tmp_path}/s.json")
    assert result.returncode == 0 and "nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout
    assert "compound-split" in result.stdout
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["bleu"] == pytest.approx(ours["bleu"]) and "chrf" in saved


def test_score_refuses_misaligned_files(tmp_path):
    (tmp_path / "h").write_text("a\nb\n")
    (tmp_path / "r").write_text("a\n")
    result = cli("nmt.score", f"hyp={tmp_path}/h", f"ref={tmp_path}/r")
    assert result.returncode == 2 and "has 2 lines" in result.stderr


@pytest.mark.parametrize("module,args,field", [
    ("nmt.translate", ["checkpoint=x.pt", "beam=0"], "beam=0"),
    ("nmt.translate", ["checkpoint=x.pt", "beam=-3"], "beam=-3"),
    ("nmt.translate", ["checkpoint=x.pt", "alpha=-1"], "alpha=-1.0"),
    ("nmt.train", ["train.max_tokens=0"], "train.max_tokens=0"),
    ("nmt.train", ["train.update_freq=0"], "train.update_freq=0"),
    ("nmt.train", ["model.clip=-1"], "model.clip=-1"),
    ("nmt.train", ["model.heads=3"], "model.d_model=256"),
    ("nmt.train", ["train.keep_last=5", "train.average_last=20"], "train.average_last=20"),
    ("nmt.prepare", ["data.vocab_size=0"], "data.vocab_size=0"),
])
def test_out_of_range_values_are_one_line_errors(module, args, field, tmp_path):
    result = cli(module, *args, f"hydra.run.dir={tmp_path}") if module == "nmt.train" else cli(module, *args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"{field} is invalid" in result.stderr


@pytest.mark.parametrize("module,args,named", [
    ("nmt.train", ["train.max_step=3"], "train.max_step is not a field: did you mean train.max_steps?"),
    ("nmt.train", ["trian.max_steps=3"], "trian.max_steps is not a field: did you mean train.max_steps?"),
    ("nmt.train", ["model=huge"], "model=huge is not a preset (presets: base, big, tiny)"),
    ("nmt.train", ["model=tinny"], "model=tinny is not a preset: did you mean model=tiny?"),
    ("nmt.train", ["+experiment=tabel1"], "did you mean +experiment=table1?"),
    ("nmt.train", ["model.position=relatve"], "model.position=relatve is not a choice: did you mean relative? "
                                              "(relative | absolute | both | none | learned | t5 | alibi | rope)"),
    ("nmt.translate", ["checkpoint=x.pt", "beem=4"], "beem is not a field: did you mean beam?"),
    ("nmt.translate", ["checkpoint=x.pt", "beam=four"], "Value 'four'"),
    ("nmt.score", ["hyp=a", "ref=b", "lang=de", "reff=c"], "reff is not a field: did you mean ref?"),
    ("nmt.prepare", ["data.vocab=10"], "data.vocab is not a field: did you mean data.vocab_size?"),
])
def test_a_mistyped_override_is_one_line_exit_2(module, args, named):
    result = cli(module, *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr, result.stderr


def test_decoding_runs_bf16_on_gpus_that_have_it_and_fp32_elsewhere(monkeypatch):
    from functools import partial

    from nmt.modes import Precision
    from nmt.runtime.precision import autocast_dtype

    decoding_dtype = partial(autocast_dtype, training=False)

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **kw: True)
    assert decoding_dtype(Precision.auto, cuda) == torch.bfloat16
    assert decoding_dtype(Precision.auto, cpu) is None
    assert decoding_dtype(Precision.fp32, cuda) is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **kw: False)
    assert decoding_dtype(Precision.auto, cuda) is None  # no fp16 without loss scaling's safety net
    assert autocast_dtype(Precision.auto, cuda) == torch.float16  # training has its GradScaler
    # sm_70/75 (V100, T4): bf16 only emulated, which is_bf16_supported() counts unless told not to
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert autocast_dtype(Precision.auto, cuda) == torch.float16
    assert decoding_dtype(Precision.auto, cuda) is None


def test_a_pathological_line_is_cut_and_every_line_answered(checkpoint, tmp_path):
    """A 10,000-word line (a paragraph without breaks) is cut to max_input_tokens with a warning naming it; both
    lines get their output line, in bounded time."""
    import random

    words = multi30k_words()
    rng = random.Random(0)
    src = tmp_path / "in.en"
    src.write_text(" ".join(rng.choice(words) for _ in range(10_000)) + "\nA dog runs.\n", encoding="utf-8")
    result = cli("nmt.translate", f"checkpoint={checkpoint}", f"input={src}", f"output={tmp_path}/out")
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "out").read_text(encoding="utf-8").split("\n")) - 1 == 2
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "input line 1 has" in warnings[0] and "truncated to 1024" in warnings[0]
    short = cli("nmt.translate", f"checkpoint={checkpoint}", f"input={src}", f"output={tmp_path}/out",
                "max_input_tokens=20")
    assert "truncated to 20" in short.stderr


def multi30k_words():
    from tests.conftest import multi30k_lines

    return " ".join(multi30k_lines("train", "en", 200)).split()


def test_translate_takes_the_threads_it_is_given(checkpoint, tmp_path):
    """threads=N: decoding beside a training job takes N threads, not every core (torch's default)."""
    (tmp_path / "in.en").write_text("A dog runs.\n")
    probe = ("import sys, torch, nmt.translate as t\n"
             f"sys.argv = ['relnmt-translate', 'checkpoint={checkpoint}', 'input={tmp_path / 'in.en'}', "
             f"'output={tmp_path / 'out.de'}', 'beam=1', 'threads=1']\n"
             "try:\n    t.main()\nexcept SystemExit:\n    pass\n"
             "print('THREADS', torch.get_num_threads(), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"})
    assert "THREADS 1" in done.stderr and (tmp_path / "out.de").read_text().count("\n") == 1, done.stderr[-2000:]
    refused = cli("nmt.translate", f"checkpoint={checkpoint}", "threads=-1", stdin="A dog.\n")
    assert refused.returncode == 2 and "threads" in refused.stderr and "Traceback" not in refused.stderr


def test_translate_shortens_openmps_spin_before_torch_loads_it_and_a_users_value_wins():
    """GOMP_SPINCOUNT is read when torch loads libgomp: nmt.translate sets it before torch is first imported."""
    probe = ("import os, sys\n"
             "class Probe:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'torch': print('torch imported with', os.environ.get('GOMP_SPINCOUNT'), flush=True)\n"
             "sys.meta_path.insert(0, Probe())\n"
             "import nmt.translate\n")
    for given, seen in ((None, "10000"), ("300000", "300000")):
        env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"} | ({"GOMP_SPINCOUNT": given} if given else {})
        done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120, check=True)
        assert done.stdout.splitlines()[0] == f"torch imported with {seen}", done.stdout
