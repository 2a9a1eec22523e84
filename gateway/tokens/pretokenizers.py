"""How llama.cpp splits text into words before BPE, per `tokenizer.ggml.pre` (src/llama-vocab.cpp).

Each entry is the list of regular expressions llama.cpp applies in sequence (every match becomes its own piece,
the text between matches too), plus the flags the same file sets next to it. In Hugging Face terms each regex is a
`Split(pattern, behavior="isolated")`. Pre-tokenizers whose llama.cpp implementation is custom code rather than a
regex (kimi-k2, afmoe, superbpe, mmbert, whitespace) are absent, so they are reported as unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass

# Contractions, spelled without inline flags as llama.cpp does (its regex engine lacks (?i:...)).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
    r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Non-ASCII characters are escaped: editors and tools may normalize them (U+1FD3 becomes U+0390).
_DEEPSEEK_LLM_LETTERS = (
    r"\s?[A-Za-z"
    "\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115"
    "\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943"
    "]+"
)
_DEEPSEEK3_MAIN = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER_RUN = r"((?=[\p{L}])([^a-z]))"
_LOWER_RUN = r"((?=[\p{L}])([^A-Z]))"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_RUN}*{_LOWER_RUN}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_RUN}+{_LOWER_RUN}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_RUN}*{_LOWER_RUN}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_RUN}+{_LOWER_RUN}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CASED_WORDS = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?"
)
_BLOOM = r" ?[^(\s|.,!?" + "\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_NEWLINE_RUNS = r"[^\n]+|[\n]+"
_KANJI_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


@dataclass(frozen=True, slots=True)
class PreTokenizerSpec:
    """The word-splitting rules of one llama.cpp pre-tokenizer type and the flags set beside them."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool | None = None  # None: keep the vocabulary's default (false for BPE)
    byte_encode: bool = True  # GPT-2 byte-to-unicode mapping; False: raw UTF-8 with <0xXX> byte fallback
    escape_whitespace: bool = False  # spaces become U+2581 before BPE (Gemma 4)


_DEFAULT = PreTokenizerSpec(
    (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
)
_STARCODER = PreTokenizerSpec((r"\p{N}", _GPT2))


def _spec_table() -> dict[str, PreTokenizerSpec]:
    llama3 = PreTokenizerSpec((_LLAMA3,), ignore_merges=True, add_bos=True)
    gpt2 = PreTokenizerSpec((_GPT2,))
    qwen2 = PreTokenizerSpec((_QWEN2,))
    deepseek3 = PreTokenizerSpec((r"\p{N}{1,3}", _KANJI_KANA, _DEEPSEEK3_MAIN))
    gpt4o = PreTokenizerSpec((_GPT4O,))
    bloom = PreTokenizerSpec((_BLOOM,))
    chatglm = PreTokenizerSpec((_LLAMA3,))
    gemma4 = PreTokenizerSpec((_NEWLINE_RUNS,), byte_encode=False, escape_whitespace=True)
    table: dict[str, PreTokenizerSpec] = {
        "default": _DEFAULT,
        "minicpm5": PreTokenizerSpec((r"\p{N}{1,3}", _QWEN2.replace(r"|\p{N}|", r"|\p{N}+|", 1)), ignore_merges=True),
        "deepseek-llm": PreTokenizerSpec(
            (
                "[\r\n]",
                _DEEPSEEK_LLM_LETTERS,
                r"\s?[!-/:-~" + "\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                r"\s+$",
                _CJK,
                r"\p{N}+",
            )
        ),
        "deepseek-coder": PreTokenizerSpec(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
        "deepseek-v3": deepseek3,
        "hunyuan-dense": deepseek3,
        "hy_v4": deepseek3,
        "joyai-llm": deepseek3,
        "spark2_5": PreTokenizerSpec(
            (
                r"\p{N}{1,3}",
                _KANJI_KANA,
                _DEEPSEEK3_MAIN.replace(r"[\r\n]*|\s*[\r\n]+|", "|[\r\n]|", 1),
                r"\p{N}",
            )
        ),
        "youtu": PreTokenizerSpec(
            (
                "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|"
                + _KANJI_KANA,
                _CASED_WORDS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ),
            ignore_merges=True,
        ),
        "falcon": PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
        "mpt": gpt2,
        "starcoder": _STARCODER,
        "jais-2": PreTokenizerSpec((_JAIS2,)),
        "gemma4": gemma4,
        "granite-embed-multi-311m": gemma4,
        "sarvam-moe": gemma4,
        "refact": _STARCODER,
        "command-r": _STARCODER,
        "qwen2": qwen2,
        "deepseek-r1-qwen": qwen2,
        "kormo": qwen2,
        "f2llmv2": qwen2,
        "megrez": qwen2,
        "qwen35": PreTokenizerSpec((_QWEN35,)),
        "stablelm2": qwen2,
        "olmo": gpt2,
        "dbrx": PreTokenizerSpec((_LLAMA3,)),
        "smaug-bpe": PreTokenizerSpec((_LLAMA3,)),
        "poro-chat": bloom,
        "bloom": bloom,
        "gpt3-finnish": bloom,
        "chatglm-bpe": chatglm,
        "glm4": PreTokenizerSpec((_LLAMA3,), ignore_merges=True),
        "glm5": PreTokenizerSpec((_LLAMA3,), ignore_merges=True),
        "viking": PreTokenizerSpec((_BLOOM, r"\p{N}")),
        "jais": gpt2,
        "tekken": PreTokenizerSpec((_TEKKEN,), ignore_merges=True, add_bos=True),
        "smollm": _STARCODER,
        "codeshell": _STARCODER,
        "exaone": _STARCODER,
        "exaone4": gpt2,
        "exaone-moe": PreTokenizerSpec(
            (
                _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
            )
        ),
        "minerva-7b": _STARCODER,
        "mellum2": _STARCODER,
        "gpt-4o": gpt4o,
        "llama4": gpt4o,
        "kanana2": gpt4o,
        "talkie": gpt4o,
        "minimax-m2": gpt4o,
        "tiny_aya": PreTokenizerSpec(
            (
                r"\d{1,3}(?=(?:\d{3})*\b)",
                _CASED_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            )
        ),
        "trillion": gpt2,
        "granite-docling": gpt2,
        "bailingmoe": PreTokenizerSpec(
            (
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
            )
        ),
        "seed-coder": PreTokenizerSpec(
            (
                _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+",
            )
        ),
        "hunyuan": qwen2,
        "ufakzeka": PreTokenizerSpec(
            (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
        ),
        "grok-2": qwen2,
        "laguna": PreTokenizerSpec((_NEWLINE_RUNS, _QWEN2)),
        "solar-open": qwen2,
    }
    table["bailingmoe2"] = table["llada-moe"] = table["bailingmoe"]
    table["cohere2moe"] = table["tiny_aya"]
    table["granite-embed-multi-97m"] = PreTokenizerSpec(
        (_GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])"),),
        ignore_merges=True,
    )
    for name in (
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
    ):
        table[name] = llama3
    for name in (
        "gpt-2",
        "phi-2",
        "jina-es",
        "jina-de",
        "gigachat",
        "jina-v2-es",
        "jina-v2-de",
        "a.x-4.0",
        "mellum",
        "modern-bert",
        "jina-v1-en",
        "jina-v2-code",
        "roberta-bpe",
    ):
        table[name] = gpt2
    return table


PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = _spec_table()


def pre_tokenizer_spec(pre: str | None) -> PreTokenizerSpec | None:
    """The spec for a `tokenizer.ggml.pre` value; an empty or missing value means llama.cpp's default."""
    if not pre:
        return _DEFAULT
    return PRE_TOKENIZERS.get(pre)
