# make demo   — set up .venv on a fresh machine, then train the dates demo (< 3 min)
# make serve  — attnkit serve on runs/multi30k_en_de, else on runs/demo (make demo first if missing); prints the URL
# make test   — set up .venv, then run the test suite (make test-fast: the inner loop, under 2 minutes)
# make browser — Debian's chromium and chromium-driver (apt-get, only when missing): the explorer's browser tests
# make espeak — Debian's espeak-ng (apt-get, only when missing): the voices of spoken Multi30k (make multi30k-speech)
# make java — Debian's default-jre-headless (apt-get, only when missing): the COCO caption evaluation (pycocoevalcap)
# make multi30k — the English->German recipe (about 60 min on 2 cores), then its results JSON
# make multi30k-lc — the same Transformer on lowercased text, as Wu et al. train it (about 60 min)
# make multi30k-rnnsearch, multi30k-rnnencdec — the same recipe for the RNN encoder-decoders
# make tatoeba-rnnencdec, tatoeba-rnnsearch, tatoeba-transformer — the same three on Tatoeba, long sentences held out
# make by-length — BLEU against sentence length for the three systems on Multi30k and Tatoeba, JSON + plots
# make results — docs/results.md's tables and the README's results table, written anew from bench/results/*.json
# make complexity — attnkit bench complexity (RNN vs convolution vs self-attention; several minutes)
# make tinyshakespeare, wikitext2 — the GPT recipes (30 and 60 training minutes), then their results JSON
# make sst2, mrpc, stsb — the shipped MiniLM fine-tuned on GLUE SST-2 (45 training minutes), MRPC and STS-B (30 each),
#              selected on dev, then their results JSON
# make sst2-gpt — GPT-1's recipe on SST-2: attnkit's GPT fine-tuned from random weights and from the WikiText-2 LM
#              (20 training minutes each), tabled with MiniLM fine-tuned and frozen
# make easy-vqa — Show, Ask, Attend and Answer on easy-VQA and its two baselines (14 training minutes each), JSON
# make transfer — pretrain on WikiText-2, fine-tune on Tiny Shakespeare vs from scratch (about 40 min), JSON + plot
# make flickr8k — Show, Attend and Tell on Flickr8k (feature extraction + training within 60 min), then its JSON
# make flickr8k-transformer — the Transformer captioner on the same grids, then its JSON
# make fsdd-digits — LAS and the Speech Transformer on spoken FSDD digit strings (20 min each) and five
#              speaker-held-out folds, then their JSONs (docs/speech.md)
# make multi30k-speech — LAS and the Speech Transformer on Multi30k's captions spoken by espeak-ng (60 training
#              minutes each; MULTI30K_SPEECH_MINUTES), scored on test2016 and in a held-out voice, then their JSONs
# make lab — .venv with the notebooks extra, each notebooks/NN_slug.py as a working copy NN_slug.ipynb where there is
#              none, then JupyterLab on notebooks/ (open 01_attention_pooling.ipynb and run it: the lectures begin)
# make notebooks — every notebooks/*.py run top to bottom at the full budget (a few minutes each), kept executed
#              in runs/notebooks/executed/, rendered with its figures into docs/notebooks/ (Markdown), the wall time
#              of each at both budgets in docs/notebooks/README.md (NOTEBOOKS_BUDGET=small: a quick rendering)
# make notebooks-exercises — copies of the notebooks with each solution blanked (raise NotImplementedError), .py and
#              .ipynb, into notebooks/exercises/ (EXERCISES_DIR=... elsewhere): a class's starting point
# make wheel-check — build the wheel, install it with torch==2.13.0 into a fresh python3.11 venv, run attnkit
#              --version and a 30-step demo from it (one of make test's tests; under a minute, mostly installing torch)
# make threads-demo — demo training steps/s with one core held busy: torch's default threads against attnkit's
#              (bench/results/threads_demo.json; run it on an otherwise quiet machine)
# make bench — attnkit against torch.nn.MultiheadAttention, Hugging Face and CTranslate2 (attention op, training and
#              translation throughput, about 15 min; runs `make multi30k` first if its checkpoint is missing), JSON
#              into bench/results/
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
, := ,
# Freshly mapped memory costs a page fault per 4 KiB on first touch, and a training step allocates the same large
# tensors again and again: jemalloc (Debian libjemalloc2) when present, told never to hand freed pages back
# (its default decay made a Multi30k training step 1.24x slower). By default jemalloc splits a kept free extent
# only for a request at least 1/64 of its size, and a bf16 training process grew by megabytes a step; allowed down
# to 1/1024 (lg_extent_max_active_fit) it stays flat, and steps run as fast in fp32 and bf16 (docs/performance.md).
# The attnkit command line starts itself again under jemalloc with these settings where the system has it
# (attnkit.allocator); $(RUN) preloads it for what runs Python directly (the tests, the benches). Without jemalloc
# the command line sets glibc's malloc the same way (attnkit.fast.memory).
JEMALLOC := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib/aarch64-linux-gnu/libjemalloc.so.2))
RUN    := $(if $(JEMALLOC),LD_PRELOAD=$(JEMALLOC) \
	MALLOC_CONF=dirty_decay_ms:-1$(,)muzzy_decay_ms:-1$(,)lg_extent_max_active_fit:10)

.PHONY: jemalloc serve demo test results multi30k multi30k-lc multi30k-rnnsearch multi30k-rnnencdec tatoeba-rnnencdec tatoeba-rnnsearch tatoeba-transformer by-length complexity flickr8k flickr8k-transformer tinyshakespeare wikitext2 sst2 mrpc stsb sst2-gpt easy-vqa transfer fsdd-digits multi30k-speech speech-multi30k bench lint clean wheel-check threads-demo browser java espeak screenshots notebooks notebooks-exercises lab

$(STAMP): pyproject.toml | jemalloc
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(RUN) $(VENV)/bin/attnkit demo --run-dir runs/demo

# attnkit serve on the Multi30k recipe's run when it exists, else on the demo's (trained first by make demo if
# missing); the attention explorer at the printed URL, the API's page at /docs. SERVE_PORT=8001 make serve to move.
SERVE_PORT ?= 8000
serve: $(STAMP)
	@if [ -d runs/multi30k_en_de/checkpoints ]; then run=runs/multi30k_en_de; else run=runs/demo; \
		if [ ! -d runs/demo/checkpoints ]; then $(MAKE) demo || [ -d runs/demo/checkpoints ] || exit 1; fi; fi; \
	echo "make serve: serving $$run: open http://127.0.0.1:$(SERVE_PORT)/ (the explorer; the API at /docs; Ctrl-C stops)"; \
	$(RUN) exec $(VENV)/bin/attnkit serve $$run --port $(SERVE_PORT)

# two pytest workers (one torch thread each), the longest tests taken first as workers free up; the wheel check
# (make wheel-check) is one of those tests, so that its install overlaps the others rather than coming first
test: $(STAMP) browser java espeak jemalloc
	$(RUN) $(PY) -m pytest -q -n 2 --dist worksteal

# the README's pictures of the explorer (docs/figures/explorer_*.png) from the recipes' trained models: those of
# make multi30k, multi30k-rnnsearch, flickr8k, tinyshakespeare and sst2 that exist (docs/figures/explorer.json
# names each picture's checkpoint); a view whose run is missing keeps its picture
screenshots: $(STAMP) browser
	$(RUN) $(PY) bench/screenshots.py

# the inner loop: everything but the slow (compiling, training, browser) and internals-pinning tests
test-fast: $(STAMP)
	$(RUN) $(PY) -m pytest -q -n 2 --dist worksteal -m "not slow and not internals"

# tests/test_explorer.py drives the explorer in a real headless Chromium through Selenium (Playwright's own browser
# download cannot work here); without /usr/bin/chromium after this target those tests are skipped, not failed
APT := $(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi; \
	if ! command -v apt-get > /dev/null; then echo "make browser: no apt-get: install Chromium and its driver \
	yourself (the browser tests are skipped without them)"; exit 0; fi; \
	echo "make browser: installing chromium and chromium-driver with apt-get"; \
	$(APT) install -y -q chromium chromium-driver > /dev/null 2>&1 \
		|| { $(APT) update -q > /dev/null && $(APT) install -y -q chromium chromium-driver > /dev/null; } \
		|| echo "make browser: apt-get could not install chromium (the browser tests are skipped without it)"

# the COCO caption evaluation (pycocoevalcap's PTB tokenizer and METEOR, in tests/test_metrics.py and make flickr8k)
# runs on Java; without `java` after this target those tests are skipped, not failed
# Debian's libjemalloc2 (apt-get, only when missing): the allocator attnkit's command line starts again under
# (attnkit.allocator), and the one $(RUN) preloads; without it both keep glibc's malloc
jemalloc:
	@if /sbin/ldconfig -p 2>/dev/null | grep -q 'libjemalloc\.so\.2 '; then exit 0; fi; \
	if ! command -v apt-get > /dev/null; then echo "make jemalloc: no apt-get: install jemalloc yourself \
	(attnkit then runs on the C library's malloc)"; exit 0; fi; \
	echo "make jemalloc: installing libjemalloc2 with apt-get"; \
	$(APT) install -y -q libjemalloc2 > /dev/null 2>&1 \
		|| { $(APT) update -q > /dev/null && $(APT) install -y -q libjemalloc2 > /dev/null; } \
		|| echo "make jemalloc: apt-get could not install libjemalloc2 (attnkit then runs on the C library's malloc)"

# spoken Multi30k's voices (tests/test_spoken_multi30k.py, make multi30k-speech); without `espeak-ng` after this
# target its synthesising tests are skipped, not failed
espeak:
	@if command -v espeak-ng > /dev/null; then exit 0; fi; \
	if ! command -v apt-get > /dev/null; then echo "make espeak: no apt-get: install espeak-ng yourself \
	(the spoken Multi30k tests are skipped without it)"; exit 0; fi; \
	echo "make espeak: installing espeak-ng with apt-get"; \
	$(APT) install -y -q espeak-ng > /dev/null 2>&1 \
		|| { $(APT) update -q > /dev/null && $(APT) install -y -q espeak-ng > /dev/null; } \
		|| echo "make espeak: apt-get could not install espeak-ng (the spoken Multi30k tests are skipped without it)"

java:
	@if command -v java > /dev/null; then exit 0; fi; \
	if ! command -v apt-get > /dev/null; then echo "make java: no apt-get: install a Java runtime yourself \
	(the COCO caption tests are skipped without it)"; exit 0; fi; \
	echo "make java: installing default-jre-headless with apt-get"; \
	$(APT) install -y -q default-jre-headless > /dev/null 2>&1 \
		|| { $(APT) update -q > /dev/null && $(APT) install -y -q default-jre-headless > /dev/null; } \
		|| echo "make java: apt-get could not install default-jre-headless (the COCO caption tests are skipped without it)"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

MULTI30K_TRAIN := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/multi30k_en_de.toml --run-dir runs/multi30k_en_de
multi30k: $(STAMP)
	mkdir -p runs/multi30k_en_de && date +%s > runs/multi30k_en_de/started
	$(RUN) $(MULTI30K_TRAIN)
	date +%s > runs/multi30k_en_de/finished
	$(RUN) $(PY) bench/multi30k_en_de.py --run-dir runs/multi30k_en_de --train-command "$(MULTI30K_TRAIN)"

MULTI30K_LC_TRAIN := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/multi30k_en_de_lc.toml --run-dir runs/multi30k_en_de_lc
multi30k-lc: $(STAMP)
	mkdir -p runs/multi30k_en_de_lc && date +%s > runs/multi30k_en_de_lc/started
	$(RUN) $(MULTI30K_LC_TRAIN)
	date +%s > runs/multi30k_en_de_lc/finished
	$(RUN) $(PY) bench/multi30k_en_de.py --run-dir runs/multi30k_en_de_lc --train-command "$(MULTI30K_LC_TRAIN)"

MULTI30K_RNN = OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/multi30k_en_de_$(1).toml --run-dir runs/multi30k_en_de_$(1)
multi30k-rnnsearch multi30k-rnnencdec: multi30k-%: $(STAMP)
	mkdir -p runs/multi30k_en_de_$* && date +%s > runs/multi30k_en_de_$*/started
	$(RUN) $(call MULTI30K_RNN,$*)
	date +%s > runs/multi30k_en_de_$*/finished
	$(RUN) $(PY) bench/multi30k_en_de.py --run-dir runs/multi30k_en_de_$* --train-command "$(call MULTI30K_RNN,$*)"

TATOEBA_TRAIN = OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/tatoeba_en_de_$(1).toml --run-dir runs/tatoeba_en_de_$(1)
tatoeba-rnnencdec tatoeba-rnnsearch tatoeba-transformer: tatoeba-%: $(STAMP)
	$(RUN) $(call TATOEBA_TRAIN,$*)

# each run directory's best checkpoint; needs the three multi30k* and three tatoeba-* runs above
BY_LENGTH_SYSTEMS = --system RNNencdec=runs/$(1)_en_de_rnnencdec --system RNNsearch=runs/$(1)_en_de_rnnsearch --system Transformer=runs/$(1)_en_de$(2)
by-length: $(STAMP)
	$(RUN) $(PY) bench/bleu_by_length.py --data multi30k $(call BY_LENGTH_SYSTEMS,multi30k,) --out bench/results/bleu_by_length_multi30k.json
	$(RUN) $(PY) bench/bleu_by_length.py --data tatoeba $(call BY_LENGTH_SYSTEMS,tatoeba,_transformer) --out bench/results/bleu_by_length_tatoeba.json

# the standard library only (no venv needed); tests/test_docs.py runs it with --check
results:
	python3 bench/results.py

complexity: $(STAMP)
	$(VENV)/bin/attnkit bench complexity

FLICKR8K_TRAIN = OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/$(1).toml --run-dir runs/$(1)
FLICKR8K_CONFIG_flickr8k := flickr8k_sat
FLICKR8K_CONFIG_flickr8k-transformer := flickr8k_transformer
flickr8k flickr8k-transformer: $(STAMP) java
	mkdir -p runs/$(FLICKR8K_CONFIG_$@) && date +%s > runs/$(FLICKR8K_CONFIG_$@)/started
	$(RUN) $(PY) bench/extract_flickr8k_features.py --config configs/$(FLICKR8K_CONFIG_$@).toml --cache-dir runs/features \
		--threads 2
	date +%s > runs/$(FLICKR8K_CONFIG_$@)/extracted
	$(RUN) $(call FLICKR8K_TRAIN,$(FLICKR8K_CONFIG_$@))
	date +%s > runs/$(FLICKR8K_CONFIG_$@)/finished
	$(RUN) $(PY) bench/flickr8k_captioning.py --run-dir runs/$(FLICKR8K_CONFIG_$@) \
		--train-command "$(call FLICKR8K_TRAIN,$(FLICKR8K_CONFIG_$@))"

LM_CONFIG_tinyshakespeare := tinyshakespeare_char
LM_CONFIG_wikitext2 := wikitext2_word
LM_TRAIN = OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/$(1).toml --run-dir runs/$(1)
tinyshakespeare wikitext2: %: $(STAMP)
	$(RUN) $(call LM_TRAIN,$(LM_CONFIG_$*))
	$(RUN) $(PY) bench/language_model.py --run-dir runs/$(LM_CONFIG_$*) --train-command "$(call LM_TRAIN,$(LM_CONFIG_$*))"

# speech: LAS and the Speech Transformer on spoken FSDD digit strings (20 training minutes each, one process on two
# threads), scored on test strings of unseen recordings; then each once per speaker-held-out fold. FSDD_SET adds
# --set overrides to every run (a smoke: FSDD_SET="--set train.max_minutes=2")
FSDD_CONFIGS := fsdd_digits_las fsdd_digits_speech_transformer
FSDD_SPEAKERS := george jackson nicolas theo yweweler
FSDD_TRAIN = $(VENV)/bin/attnkit train configs/$(1).toml --run-dir runs/$(2) --threads 2 --overwrite $(3) $(FSDD_SET)
fsdd-digits: $(STAMP)
	set -e; for c in $(FSDD_CONFIGS); do \
		$(RUN) $(call FSDD_TRAIN,$$c,$$c); \
		$(RUN) $(PY) bench/fsdd_digits.py --run-dir runs/$$c --train-command "$(call FSDD_TRAIN,$$c,$$c)"; \
		for s in $(FSDD_SPEAKERS); do \
			$(RUN) $(call FSDD_TRAIN,$$c,$${c}_heldout_$$s,--set data.held_out_speaker=$$s); \
			$(RUN) $(PY) bench/fsdd_digits.py --run-dir runs/$${c}_heldout_$$s \
				--train-command "$(call FSDD_TRAIN,$$c,$${c}_heldout_$$s,--set data.held_out_speaker=$$s)"; \
		done; \
	done

# speech: LAS and the Speech Transformer on Multi30k's English captions spoken by espeak-ng (installed first where
# missing), MULTI30K_SPEECH_MINUTES training minutes each (one process on two threads); the first run synthesises
# the corpus into runs/speech (once: later runs read it there); each best checkpoint is scored on test2016 in the
# training voices and in the held-out voice. MULTI30K_SPEECH_SET adds --set overrides to both runs
MULTI30K_SPEECH_MINUTES ?= 60
MULTI30K_SPEECH_CONFIGS := multi30k_speech_las multi30k_speech_speech_transformer
MULTI30K_SPEECH_TRAIN = $(VENV)/bin/attnkit train configs/$(1).toml --run-dir runs/$(1) --threads 2 --overwrite \
	--set train.max_minutes=$(MULTI30K_SPEECH_MINUTES) $(MULTI30K_SPEECH_SET)
multi30k-speech: $(STAMP) espeak
	set -e; for c in $(MULTI30K_SPEECH_CONFIGS); do \
		$(RUN) $(call MULTI30K_SPEECH_TRAIN,$$c); \
		$(RUN) $(PY) bench/multi30k_speech.py --run-dir runs/$$c --train-command "$(call MULTI30K_SPEECH_TRAIN,$$c)"; \
	done
speech-multi30k: multi30k-speech

# fine-tuning: one process, the CLI's threads
GLUE_TRAIN = $(VENV)/bin/attnkit train configs/glue_$(1).toml --run-dir runs/glue_$(1)
sst2 mrpc stsb: %: $(STAMP)
	$(RUN) $(call GLUE_TRAIN,$*)
	$(RUN) $(PY) bench/glue.py --run-dir runs/glue_$* --train-command "$(call GLUE_TRAIN,$*)"

# visual question answering: the attention model and its two baselines (no attention, question only), each with
# the same budget (EASY_VQA_MINUTES=1 make easy-vqa: a smoke), then all three scored on the test split
EASY_VQA_MINUTES ?= 14
EASY_VQA_TRAIN = $(VENV)/bin/attnkit train configs/easy_vqa.toml --run-dir runs/easy_vqa$(1) \
	--set model.attention=$(2) --set train.max_minutes=$(EASY_VQA_MINUTES)
easy-vqa: $(STAMP)
	$(RUN) $(call EASY_VQA_TRAIN,,glimpses)
	$(RUN) $(call EASY_VQA_TRAIN,_pooled,pooled)
	$(RUN) $(call EASY_VQA_TRAIN,_question_only,none)
	$(RUN) $(PY) bench/vqa.py --run glimpses=runs/easy_vqa --run pooled=runs/easy_vqa_pooled \
		--run none=runs/easy_vqa_question_only --train-command "$(call EASY_VQA_TRAIN,,glimpses) && \
		$(call EASY_VQA_TRAIN,_pooled,pooled) && $(call EASY_VQA_TRAIN,_question_only,none)"

TORCHRUN := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train
TRANSFER_PRE := $(TORCHRUN) configs/transfer_pretrain_wikitext2.toml --run-dir runs/transfer/pretrain
TRANSFER_FINE := $(TORCHRUN) configs/transfer_finetune_tinyshakespeare.toml --run-dir runs/transfer/finetune --set train.init_from=runs/transfer/pretrain
TRANSFER_SCRATCH := $(TORCHRUN) configs/transfer_finetune_tinyshakespeare.toml --run-dir runs/transfer/scratch
TRANSFER_PRETRAINED := runs/transfer/pretrain/checkpoints/last/model.safetensors
$(TRANSFER_PRETRAINED):
	$(PY) bench/transfer.py tokenizer --out runs/transfer/spm.model
	$(RUN) $(TRANSFER_PRE)

transfer: $(STAMP) $(TRANSFER_PRETRAINED)
	$(RUN) $(TRANSFER_FINE)
	$(RUN) $(TRANSFER_SCRATCH)
	$(PY) bench/transfer.py report --commands "$(TRANSFER_PRE) && $(TRANSFER_FINE) && $(TRANSFER_SCRATCH)"

# GPT-1's recipe on SST-2 from random weights and from the transfer recipe's WikiText-2 LM (pretrained first where
# missing), then one table beside MiniLM fine-tuned and MiniLM's frozen embeddings
GPT_SST2 = $(VENV)/bin/attnkit train configs/glue_sst2_gpt.toml --run-dir runs/glue_sst2_gpt$(1)
sst2-gpt: $(STAMP) $(TRANSFER_PRETRAINED)
	$(RUN) $(call GPT_SST2,_scratch) --set model.from_scratch=true
	$(RUN) $(PY) bench/glue.py --run-dir runs/glue_sst2_gpt_scratch --out bench/results/glue_sst2_gpt_scratch.json \
		--train-command "$(call GPT_SST2,_scratch) --set model.from_scratch=true"
	$(RUN) $(call GPT_SST2,)
	$(RUN) $(PY) bench/glue.py --run-dir runs/glue_sst2_gpt --train-command "$(call GPT_SST2,)"
	$(RUN) $(PY) bench/sst2_pretraining.py

# the translation bench decodes the Multi30k recipe's averaged checkpoint: where there is none, make trains it first
MULTI30K_CHECKPOINT := runs/multi30k_en_de/checkpoints/averaged/model.safetensors
$(MULTI30K_CHECKPOINT):
	$(MAKE) multi30k

bench: $(STAMP) $(MULTI30K_CHECKPOINT)
	$(RUN) $(PY) bench/attention_op.py
	$(RUN) $(PY) bench/train_throughput.py
	$(RUN) $(PY) bench/translate_throughput.py

# What a user gets from `pip install attnkit`: the wheel alone (no -e, no source tree on the path) with torch==2.13.0,
# the lower bound pyproject.toml states, in a new venv (--no-compile: bytecode only for what runs). The wheel is built
# from a copy of the sources (setuptools leaves build/ beside pyproject.toml). pip's cache is kept between runs.
WHEEL_PYTHON ?= python3.11
# every module under src/attnkit is in the wheel (what the package finder settings leave out fails the check)
export WHEEL_HAS_ALL_MODULES := import pathlib, sys, zipfile; names = set(zipfile.ZipFile(sys.argv[1]).namelist()); \
missing = sorted(str(p.relative_to("src")) for p in pathlib.Path("src/attnkit").rglob("*.py") \
if str(p.relative_to("src")) not in names); sys.exit(f"wheel-check: not in the wheel: {missing}" if missing else 0)
WHEEL_DEMO_STEPS ?= 30
wheel-check: $(STAMP)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; start=$$(date +%s); \
	mkdir "$$tmp/project"; tar -c --exclude=__pycache__ --exclude='*.egg-info' pyproject.toml README.md src \
		$$(ls LICENSE* 2>/dev/null) | tar -x -C "$$tmp/project"; \
	$(PY) -m build --wheel --outdir "$$tmp/dist" "$$tmp/project" > "$$tmp/build.log" 2>&1 \
		|| { cat "$$tmp/build.log"; exit 1; }; \
	$(PY) -c "$$WHEEL_HAS_ALL_MODULES" "$$tmp"/dist/attnkit-*.whl; \
	built=$$(date +%s); $(WHEEL_PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/pip" install --quiet --no-compile torch==2.13.0 > "$$tmp/pip.log" 2>&1 || { cat "$$tmp/pip.log"; exit 1; }; \
	"$$tmp/venv/bin/pip" install --quiet --no-compile "$$tmp"/dist/attnkit-*.whl >> "$$tmp/pip.log" 2>&1 || { cat "$$tmp/pip.log"; exit 1; }; \
	installed=$$(date +%s); cd "$$tmp"; \
	./venv/bin/attnkit --version; \
	rc=0; ./venv/bin/attnkit demo --run-dir "$$tmp/run" --steps $(WHEEL_DEMO_STEPS) --minutes 0.5 > demo.log 2>&1 || rc=$$?; \
	tail -n 4 demo.log; \
	if [ $$rc -gt 1 ] || ! grep -q "demo finished" demo.log || [ ! -s "$$tmp/run/attention.png" ]; then \
		cat demo.log; echo "wheel-check: the installed wheel's demo failed (exit $$rc)"; exit 1; fi; \
	end=$$(date +%s); echo "wheel-check: ok in $$((end - start)) s: build $$((built - start)) s, venv and install \
	$$((installed - built)) s, run $$((end - installed)) s (demo exit $$rc: 1 is only its accuracy bar, unmet after \
	$(WHEEL_DEMO_STEPS) steps)"

# the same .venv with the notebooks extra (Jupyter, Jupytext, nbclient, nbconvert and the extras the notebooks use),
# without the test tools: a learner's make lab installs no more than the notebooks need
NOTEBOOKS_STAMP := $(VENV)/.notebooks
$(NOTEBOOKS_STAMP): pyproject.toml | jemalloc
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[notebooks]'
	touch $(NOTEBOOKS_STAMP)

# a learner's copies are never overwritten: only a missing .ipynb is made from its .py
lab: $(NOTEBOOKS_STAMP)
	@for f in notebooks/[0-9]*.py; do [ -e "$${f%.py}.ipynb" ] || $(VENV)/bin/jupytext --quiet --to ipynb "$$f"; done
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

NOTEBOOKS_BUDGET ?= full
notebooks: $(NOTEBOOKS_STAMP)
	$(RUN) $(PY) notebooks/tools/render.py --budget $(NOTEBOOKS_BUDGET)

EXERCISES_DIR ?= notebooks/exercises
notebooks-exercises: $(NOTEBOOKS_STAMP)
	$(PY) notebooks/tools/exercises.py --out $(EXERCISES_DIR)

threads-demo: $(STAMP)
	$(PY) bench/threads_demo.py

clean:
	rm -rf runs/demo
