# make demo   — set up .venv on a fresh machine, then train the dates demo (< 3 min)
# make test   — set up .venv, then run the test suite
# make multi30k — the English->German recipe (about 60 min on 2 cores), then its results JSON
# make multi30k-rnnsearch, multi30k-rnnencdec — the same recipe for the RNN encoder-decoders
# make tatoeba-rnnencdec, tatoeba-rnnsearch, tatoeba-transformer — the same three on Tatoeba, long sentences held out
# make by-length — BLEU against sentence length for the three systems on Multi30k and Tatoeba, JSON + plots
# make complexity — attnkit bench complexity (RNN vs convolution vs self-attention; several minutes)
# make tinyshakespeare, wikitext2 — the GPT recipes (30 and 60 training minutes), then their results JSON
# make transfer — pretrain on WikiText-2, fine-tune on Tiny Shakespeare vs from scratch (about 40 min), JSON + plot
# make flickr8k — Show, Attend and Tell on Flickr8k (feature extraction + training within 60 min), then its JSON
# make bench — attnkit against torch.nn.MultiheadAttention, Hugging Face and CTranslate2 (attention op, training and
#              translation throughput, about 15 min; runs `make multi30k` first if its checkpoint is missing), JSON
#              into bench/results/
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
, := ,
# Freshly mapped memory costs a page fault per 4 KiB on first touch, and a training step allocates the same large
# tensors again and again: jemalloc (Debian libjemalloc2) when present, told never to hand freed pages back
# (its default decay made a Multi30k training step 1.24x slower). Without it attnkit's CLI sets glibc the same way
# (attnkit.memory).
JEMALLOC := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib/aarch64-linux-gnu/libjemalloc.so.2))
RUN    := $(if $(JEMALLOC),LD_PRELOAD=$(JEMALLOC) MALLOC_CONF=dirty_decay_ms:-1$(,)muzzy_decay_ms:-1)

.PHONY: demo test multi30k multi30k-rnnsearch multi30k-rnnencdec tatoeba-rnnencdec tatoeba-rnnsearch tatoeba-transformer by-length complexity flickr8k tinyshakespeare wikitext2 transfer bench lint clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(RUN) $(VENV)/bin/attnkit demo --run-dir runs/demo

test: $(STAMP)
	$(RUN) $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

MULTI30K_TRAIN := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/multi30k_en_de.toml --run-dir runs/multi30k_en_de
multi30k: $(STAMP)
	mkdir -p runs/multi30k_en_de && date +%s > runs/multi30k_en_de/started
	$(RUN) $(MULTI30K_TRAIN)
	date +%s > runs/multi30k_en_de/finished
	$(RUN) $(PY) bench/multi30k_en_de.py --run-dir runs/multi30k_en_de --train-command "$(MULTI30K_TRAIN)"

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

complexity: $(STAMP)
	$(VENV)/bin/attnkit bench complexity

FLICKR8K_TRAIN := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/flickr8k_sat.toml --run-dir runs/flickr8k_sat
flickr8k: $(STAMP)
	mkdir -p runs/flickr8k_sat && date +%s > runs/flickr8k_sat/started
	$(RUN) $(PY) bench/extract_flickr8k_features.py --cache-dir runs/features --threads 2
	date +%s > runs/flickr8k_sat/extracted
	$(RUN) $(FLICKR8K_TRAIN)
	date +%s > runs/flickr8k_sat/finished
	$(RUN) $(PY) bench/flickr8k_captioning.py --run-dir runs/flickr8k_sat --train-command "$(FLICKR8K_TRAIN)"

LM_CONFIG_tinyshakespeare := tinyshakespeare_char
LM_CONFIG_wikitext2 := wikitext2_word
LM_TRAIN = OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train configs/$(1).toml --run-dir runs/$(1)
tinyshakespeare wikitext2: %: $(STAMP)
	$(RUN) $(call LM_TRAIN,$(LM_CONFIG_$*))
	$(RUN) $(PY) bench/language_model.py --run-dir runs/$(LM_CONFIG_$*) --train-command "$(call LM_TRAIN,$(LM_CONFIG_$*))"

TORCHRUN := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=2 -m attnkit train
TRANSFER_PRE := $(TORCHRUN) configs/transfer_pretrain_wikitext2.toml --run-dir runs/transfer/pretrain
TRANSFER_FINE := $(TORCHRUN) configs/transfer_finetune_tinyshakespeare.toml --run-dir runs/transfer/finetune --set train.init_from=runs/transfer/pretrain
TRANSFER_SCRATCH := $(TORCHRUN) configs/transfer_finetune_tinyshakespeare.toml --run-dir runs/transfer/scratch
transfer: $(STAMP)
	$(PY) bench/transfer.py tokenizer --out runs/transfer/spm.model
	$(RUN) $(TRANSFER_PRE)
	$(RUN) $(TRANSFER_FINE)
	$(RUN) $(TRANSFER_SCRATCH)
	$(PY) bench/transfer.py report --commands "$(TRANSFER_PRE) && $(TRANSFER_FINE) && $(TRANSFER_SCRATCH)"

# the translation bench decodes the Multi30k recipe's averaged checkpoint: where there is none, make trains it first
MULTI30K_CHECKPOINT := runs/multi30k_en_de/checkpoints/averaged/model.safetensors
$(MULTI30K_CHECKPOINT):
	$(MAKE) multi30k

bench: $(STAMP) $(MULTI30K_CHECKPOINT)
	$(RUN) $(PY) bench/attention_op.py
	$(RUN) $(PY) bench/train_throughput.py
	$(RUN) $(PY) bench/translate_throughput.py

clean:
	rm -rf runs/demo
