"""A deterministic detector of student data that addresses the grader instead of the question.

It runs at grade time on every answer that would be sent, whatever ``--llm`` says, and again
beside the model's own flag when a draft is made: flagged data is still graded on its
content, but the item gains no points until a TA confirms the suggested score.

Text is first brought to what a reader (a person or a model) takes it for: escapes written
out (``\\u0069``, ``&#105;``) are decoded, Unicode tag characters are decoded to the ASCII they
encode, invisible and direction-changing characters are removed (their presence is itself a
flag), then NFKC folds full-width and other compatibility forms, accents and combining marks
are dropped (the voicing marks of kana kept), and letters that look like Latin ones (UTS #39
confusables: Cyrillic "а", Greek "ο"; small capitals) become those Latin letters. The patterns
then look, in English, German, French, Spanish, Portuguese, Japanese and Chinese, for the forms
seen in practice: orders to ignore the instructions, requests for marks, notes to the marker /
examiner / TA / AI, text posing as the rubric, the system or a grade, imitations of the data
delimiters and of the grader's reply.
They are kept narrow so that honest answers about attention scores, models and prompts pass
(tests/test_injection.py runs them over the course's reference and TA-scored answers;
tests/test_honest_languages.py over honest writing in every language). Each reason quotes the
words that triggered it, so a TA sees at once whether it is a false alarm.
"""
from __future__ import annotations

import functools
import gzip
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources

from grader.rubric import ANSWER_LANGUAGES
from grader.written.prompt import ABSENT, MAX_ANSWER_CHARS, MAX_GROUNDING_CHARS

INVISIBLE = "contains invisible or direction-changing characters"
TAGGED = "hides text in Unicode tag characters"

# ----------------------------------------------------------------------------- reading as a reader does

# Escapes a model reads as the characters they stand for: \uXXXX (surrogate pairs too),
# \UXXXXXXXX, \xXX and numeric HTML character references.
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})|\\x([0-9a-fA-F]{2})|&#[xX]([0-9a-fA-F]{1,6});"
                     r"|&#([0-9]{1,7});")
# Tag characters (U+E0000..E007F) spell ASCII invisibly: U+E0041 is a hidden "A".
_TAGS = re.compile("[\U000e0000-\U000e007f]+")
# Invisible characters that are not format controls (category Cf, which holds the zero-width
# and bidirectional ones): the combining grapheme joiner, Hangul fillers, Khmer inherent
# vowels and Mongolian variation selectors.
_INVISIBLE_OTHER = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0")
_LATIN_ALNUM = re.compile(r"[A-Za-z0-9]+")
_KANA = re.compile("[\u3040-\u30ff]")
_KANA_VOICING = "\u3099\u309a"


def _unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = int(next(g for g in match.groups() if g is not None), 16 if match.group(5) is None else 10)
        return chr(code) if code <= 0x10FFFF else match.group(0)
    decoded = _ESCAPE.sub(one, text)
    if decoded == text:
        return text
    # Escaped surrogate pairs decode to two lone surrogates: join them into the character.
    return decoded.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _untag(match: re.Match[str]) -> str:
    hidden = "".join(chr(ord(ch) - 0xE0000) for ch in match.group(0) if 0xE0020 <= ord(ch) <= 0xE007E)
    return f" {hidden} "


def _invisible(text: str, i: int) -> bool:
    ch = text[i]
    if ch == "\u200d" and 0 < i < len(text) - 1 and _emoji(text[i - 1]) and _emoji(text[i + 1]):
        return False   # the zero-width joiner of an emoji sequence (a woman and a laptop: one emoji)
    return unicodedata.category(ch) == "Cf" or ch in _INVISIBLE_OTHER


def _emoji(ch: str) -> bool:
    return unicodedata.category(ch) in ("So", "Sk") or ch == "\ufe0f"


@functools.cache
def _latin_lookalikes() -> dict[int, str]:
    """Each non-ASCII character that Unicode's confusables.txt (UTS #39) maps to ASCII letters or
    digits, mapped to them, and the Latin small capitals. The data is the pinned ``confusable-homoglyphs`` package's copy of
    confusables.txt, which lists each pair in both directions; confusables.txt never maps an ASCII
    letter to a non-ASCII one, so an ASCII neighbour of a non-ASCII character is its skeleton."""
    data = json.loads(resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text("utf-8"))
    table: dict[int, str] = {}
    for char, homoglyphs in data.items():
        char = char.strip("\u200e")   # the package wraps right-to-left characters in LRM marks
        if len(char) != 1 or char.isascii():
            continue
        for homoglyph in homoglyphs:
            latin = homoglyph["c"].strip("\u200e")
            if _LATIN_ALNUM.fullmatch(latin):
                # UTS #39 files capital I under l; a capital look-alike of it (Cyrillic І, Greek Ι)
                # stands for I in text, and reads as "i" in "ІGNORE".
                table[ord(char)] = "I" if latin == "l" and char.isupper() else latin
                break
    # confusables.txt leaves out most Latin small capitals (ɪɢɴᴏʀᴇ), which read as plain
    # letters: their names say which.
    for block in (range(0x0250, 0x02B0), range(0x1D00, 0x1D80), range(0xA720, 0xA800)):
        for code in block:
            name = unicodedata.name(chr(code), "")
            if re.fullmatch(r"LATIN LETTER SMALL CAPITAL [A-Z]", name):
                table.setdefault(code, name[-1].lower())
    return table


def readable(text: str) -> tuple[str, list[str]]:
    """``text`` as the patterns read it, and what hiding was undone on the way (reasons, each
    with what was hidden: the text in tag characters, the invisible characters and where)."""
    reasons: list[str] = []
    text = _unescape(text)
    if text.isascii():   # no step below changes ASCII text (most answers): skip their per-character passes
        return text, reasons
    if _TAGS.search(text):
        hidden_text = " ".join(_untag(m).strip() for m in _TAGS.finditer(text))
        reasons.append(f"{TAGGED}: {_said(hidden_text)}")
        text = _TAGS.sub(_untag, text)
    hidden = [i for i in range(len(text)) if _invisible(text, i)]
    if hidden:
        codes = list(dict.fromkeys(f"U+{ord(text[i]):04X}" for i in hidden))
        before = "".join(ch for i, ch in enumerate(text[:hidden[0]]) if i not in hidden)[-20:]
        reasons.append(f"{INVISIBLE}: {', '.join(codes[:3])}{' and more' if len(codes) > 3 else ''} "
                       f"({len(hidden)} in all), the first after {_said(before)}")
        gone = set(hidden)
        text = "".join(ch for i, ch in enumerate(text) if i not in gone)
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    # accents and marks dropped, but for the voicing marks of kana, which make other words (ブ is not フ)
    text = "".join(ch for i, ch in enumerate(text) if unicodedata.category(ch) not in ("Mn", "Me")
                   or ch in _KANA_VOICING and i and _KANA.match(text[i - 1]))
    return unicodedata.normalize("NFC", text.translate(_latin_lookalikes())), reasons


# ----------------------------------------------------------------------------- the patterns

# They run on lower-case text without accents, so "critères" is written "criteres" and "Prüfer"
# "prufer"; ``^`` and ``$`` are a line's ends. A gap of a few words never crosses a sentence end
# or a line.
_GAP = r"[^.!?。\n]{0,40}?"
_Q = "[\"'\u201c\u201d\u2018\u2019`]"   # a quote, straight or curly
_GRADER_EN = (r"(grader|graders|marker|markers|examiner|examiners|ta|tas|teaching\s+assistants?|tutor|reviewer|"
              r"evaluator|assessor|corrector|instructor|professor|grading\s+(ai|model|assistant|system|bot)|"
              r"marking\s+(ai|model|assistant|system))")
_AI_EN = r"(ai|llm|language\s+model|model|assistant|chatbot|claude|gpt|chatgpt)"
_ORDERS_EN = (r"(instructions?|rubric|criteria|criterion|guidelines?|(grading|marking)\s+(scheme|guide|rules)|"
              r"system\s+(prompt|message))")
_GIVE_EN = (r"\b(give|assign|mark|score|rate|grade)\s+(me|us|it|this(\s+(answer|response|submission|one))?|"
            r"the\s+(student|answer|response|submission))\b")
_ALL_MARKS_EN = (r"\b(full|maximum|max|all(\s+the)?|perfect|top|highest|every)\s+(possible\s+)?"
                 r"(marks?|points?|credit|score|grade)\b")

# "full marks" sent to a thing of the subject ("full marks for the cache") rather than to the answer
_NOT_A_PUN = (r"(?!\s+(for|to)\s+(the|a|an|its|their|our)\s+(?!(answer|response|submission|student|attempt|work|effort|"
              r"question|essay|exercise|grader|marker|writer|author)s?\b)[a-z])")
# A system prompt or message, named in each language the screen reads.
_SYSTEM_TERMS = (r"(system|developer|admin(istrator)?)\s+(prompt|message|instructions?)|system-?prompt|"
                 r"systemanweisung\w*|systemnachricht\w*|(message|invite|prompt|instructions?)\s+systeme|"
                 r"(mensaje|instrucciones?|prompt)\s+del\s+sistema|(mensagem|instrucoes|instrucao|prompt)\s+do\s+sistema|"
                 r"システムプロンプト|システムメッセージ|システム指示|系统提示词?|系统消息|系统指令")

_RULES: list[tuple[str, list[str]]] = [
    ("tells the grader to ignore its instructions", [
        # English
        rf"\b(ignore|disregard|override|overrule|bypass|do\s+not\s+follow|don'?t\s+follow|stop\s+following)\b"
        rf"{_GAP}\b(prompt|{_ORDERS_EN})\b",
        rf"\b(forget|skip)\b{_GAP}\b{_ORDERS_EN}\b",   # models forget and skip parts of a prompt
        r"\b(ignore|disregard|forget)\s+(all|everything|anything)\b[^.\n]{0,20}?"
        r"\b(above|before|previous(ly)?|prior|earlier|said|written)\b",
        r"\b(ignore|disregard)\s+(the|all\s+the)\s+(above|preceding|foregoing)\b",
        # German (the verb may come last)
        rf"\b(ignorier\w*|missacht\w*|vergiss|vergesst|vergessen\s+sie|ubergeh\w*|beachte\s+nicht|"
        rf"beachten\s+sie\s+nicht)\b{_GAP}"
        r"\b(anweisung\w*|instruktion\w*|vorgabe\w*|bewertungs\w*|kriteri\w*|rubrik|regeln|prompt|alles)\b",
        rf"\b(anweisung\w*|instruktion\w*|vorgaben|bewertungskriterien|kriterien|rubrik|bewertungsschema)\b{_GAP}"
        r"\b(ignorier\w*|missacht\w*|vergessen|nicht\s+beacht\w*|au(ss|ß)er\s+acht)",
        # French
        rf"\b(ignore[rsz]?|oublie[rsz]?|neglige[rz]?|ne\s+(tiens|tenez)\s+pas\s+compte|(fais|faites)\s+abstraction|"
        rf"ne\s+(suis|suivez)\s+pas)\b{_GAP}"
        r"\b(instructions?|consignes?|criteres?|bareme|grille|regles|prompt|directives?|ce\s+qui\s+precede)\b",
        # Spanish
        rf"\b(ignora[rd]?|ignore[n]?|olvida[rd]?|olvide[n]?|hagan?\s+caso\s+omiso|haz\s+caso\s+omiso|no\s+sigas|"
        rf"no\s+siga[n]?|omite|omitir|descarta[r]?)\b{_GAP}"
        r"\b(instrucciones|instruccion|indicaciones|criterios|rubrica|reglas|prompt|directrices|pautas|"
        r"lo\s+anterior)\b",
        # Portuguese
        rf"\b(ignor[ae][rm]?|esquec[ae][rm]?|desconsider[ae][rm]?|nao\s+sig[ao]m?|nao\s+sigas|deixe\s+de\s+lado)\b"
        rf"{_GAP}\b(instrucoes|instrucao|indicacoes|criterios|rubrica|regras|prompt|diretrizes|orientacoes|"
        r"o\s+que\s+foi\s+dito)\b",
        # Chinese
        r"(忽略|忽视|无视|不要理会|不理会|别理会|不要遵循|不要遵守|忘记|忘掉|抛开|跳过)[^。.\n]{0,12}?"
        r"(指令|指示|说明|规则|要求|提示词|提示|评分标准|评分规则|评分细则|评分准则)",
        # Japanese (the verb comes last)
        r"(指示|命令|ルール|規則|評価基準|採点基準|ルーブリック|プロンプト|これまでの内容|上記の内容|以上の内容)"
        r"[^。.\n]{0,12}?(無視|忘れ|従わな)",
    ]),
    ("asks for marks", [
        # English
        rf"\b(award|grant)\b{_GAP}{_ALL_MARKS_EN}",
        rf"{_GIVE_EN}{_GAP}{_ALL_MARKS_EN}",
        # bare, unless they go to a thing of the subject ("full marks for the cache": a pun on a full cache)
        rf"(\b(full|maximum|max|top)\s+(marks|credit)\b|\bfull\s+points\b|\ball\s+(the\s+)?marks\b){_NOT_A_PUN}",
        r"\b(\d+(\.\d+)?)\s*/\s*\1\s*(points?|marks?|pts)\b",
        rf"\b(deserves?|merits?|warrants?|is\s+worth)\b[^.\n]{{0,20}}?{_ALL_MARKS_EN}",
        rf"\b(please|kindly)\b{_GAP}\b(award|give|grant|pass|accept)\b{_GAP}\b(marks?|points?|credit|grade|score)\b",
        r"\b(be|grade|mark)\s+(very\s+)?(lenient(ly)?|generous(ly)?)\b",
        # German
        r"\b(volle|vollen|maximale|maximalen|hochste|hochsten)\s+(punktzahl|punkte|punktezahl|bewertung|note)\b",
        r"\b(hochstpunktzahl|bestnote|bestbewertung)\b",
        rf"\b(gib|gebt|geben\s+sie|vergib|vergeben\s+sie|erteil\w*)\b{_GAP}"
        r"\b(alle|volle|maximale|hochste)\s+(punkt\w*|note)",
        # French
        rf"\b(donne[rz]?|attribue[rz]?|accorde[rz]?|mets|mettez|mettre)\b{_GAP}"
        r"\b(la\s+note\s+max\w*|note\s+max\w*|tous\s+les\s+points|la\s+totalite\s+des\s+points|le\s+maximum|"
        r"20\s*/\s*20|la\s+meilleure\s+note|note\s+parfaite)",
        r"\b(note\s+maximale|note\s+parfaite|totalite\s+des\s+points)\b",
        # Spanish
        rf"\b(da(me|le)?|de(me|le)?|otorga(r|me|le)?|otorgue[n]?|asigna(r|me|le)?|asigne|pon(me|le)?|ponga(me|le)?|"
        rf"concede(r|me|le)?)\b{_GAP}"
        r"\b(todos\s+los\s+puntos|la\s+(maxima|mejor)\s+(puntuacion|nota|calificacion)|"
        r"(puntuacion|nota|calificacion|puntaje)\s+(maxima|completa|perfecta|maximo))",
        r"\b(nota|calificacion)\s+(maxima|perfecta)\b|\bmaxima\s+(nota|calificacion)\b",
        # Portuguese
        # "de" and "da" (de, dá folded) are prepositions too: a verb only where a request starts
        rf"((^|[.!?:;,]\s*|\bfavor\s+)(de|da)|\b(deem|atribu[ae]\w*|conced[ae]\w*|coloque|ponha|dar))\b{_GAP}"
        r"\b(a\s+nota\s+maxima|nota\s+maxima|todos\s+os\s+pontos|a\s+pontuacao\s+maxima|pontuacao\s+maxima|"
        r"nota\s+(dez|10|perfeita)|a\s+melhor\s+nota)",
        r"\b(nota|avaliacao)\s+(maxima|perfeita)\b|\bnota\s+dez\b",
        # Chinese
        r"满分|(给|打|评|判|授予|给予)[^。.\n]{0,10}?(最高分|全部分数|所有分数|全分)",
        # Japanese
        r"満点|(最高|満)点を?(つけ|付け|与え|くだ|下さ)|(全て|すべて|全部)の(点|点数|得点)を",
    ]),
    ("addresses the grader", [
        # English
        rf"\b(dear|hi|hello|hey|greetings|attention\s*[:,!]|(a\s+)?(note|message|memo|instructions?)\s+(to|for)|to)\s*"
        rf"(the\s+|my\s+|our\s+)?{_GRADER_EN}\b",
        # "Attention" greets only with its punctuation: "the attention model" is the course's subject
        rf"\b(dear|hi|hello|hey|greetings|attention\s*[:,!]|(a\s+)?(note|message|memo)\s+(to|for))\s*(the\s+)?"
        rf"{_AI_EN}\b",
        r"\b(if\s+you\s+are|you\s+are|you're)\s+(now\s+)?(an?|the)\s+(ai|llm|(large\s+)?language\s+model|ai\s+model|"
        r"ai\s+assistant|grader|marker|examiner|grading\s+\w+|automated\s+grader|autograder|teaching\s+assistant)\b",
        r"\bas\s+an?\s+(ai|llm)\b",
        rf"^\s*{_GRADER_EN}\s*[,:]\s",
        r"\b(whoever|anyone\s+who|the\s+person\s+who)\s+(is\s+)?(grades?|grading|marks?|marking|reads?|reading)"
        r"\s+this\b",
        # German
        r"\b(liebe[rns]?|sehr\s+geehrte[rns]?|hallo|(hinweis|notiz|nachricht)\s+(an|fur)|an)\s+"
        r"(den\s+|die\s+|meine[nr]?\s+)?(korrektor\w*|prufer\w*|pruefer\w*|bewerter\w*|tutor\w*|ubungsleiter\w*|"
        r"dozent\w*)\b",
        r"\b(liebe[rns]?|hallo|(hinweis|notiz|nachricht)\s+(an|fur))\s+(die\s+|das\s+|den\s+)?"
        r"(ki|sprachmodell|assistent\w*)\b",
        r"\b(du\s+bist|wenn\s+du\s+\w+\s+bist)\s+(jetzt\s+|nun\s+)?(eine?|der|die)\s+"
        r"(ki|sprachmodell|bewerter\w*|korrektor\w*|prufer\w*)\b|\bals\s+ki\b",
        # French
        r"\b(cher|chere|chers|cheres|bonjour|(note|message)\s+(au|a\s+la|a\s+l'|pour\s+le|pour\s+la)|au|a\s+la|"
        r"a\s+l')\s*(correcteur|correctrice|correcteurs|examinateur|examinatrice|evaluateur|evaluatrice|"
        r"chargee?\s+de\s+td)\b",
        r"\b(cher|chere|bonjour|(note|message)\s+(a\s+l'|au|pour\s+l'))\s*(ia|intelligence\s+artificielle|assistant)\b",
        r"\b(si\s+)?(tu\s+es|vous\s+etes)\s+(maintenant\s+)?(une?|le|la|l')\s*(ia|correcteur|correctrice|evaluateur|"
        r"examinateur|modele\s+de\s+langage|intelligence\s+artificielle)\b",
        # Spanish
        r"\b(querid[oa]s?|estimad[oa]s?|hola|(nota|mensaje)\s+(para\s+el|para\s+la|al|a\s+la)|al|a\s+la|para\s+el|"
        r"para\s+la)\s+(corrector|correctora|evaluador|evaluadora|examinador|examinadora|ayudante|tutor|tutora)\b",
        r"\b(querid[oa]|estimad[oa]|hola|(nota|mensaje)\s+para)\s+(la\s+|el\s+)?"
        r"(ia|inteligencia\s+artificial|asistente)\b",
        r"\b(si\s+)?(eres|usted\s+es)\s+(ahora\s+)?(una?|el|la)\s+(ia|corrector\w*|evaluador\w*|examinador\w*|"
        r"modelo\s+de\s+lenguaje|inteligencia\s+artificial)\b",
        # Portuguese
        r"\b(car[oa]s?|prezad[oa]s?|ola|(nota|mensagem|recado)\s+(para\s+o|para\s+a|ao|a)|ao|a|para\s+o|para\s+a)\s+"
        r"(corretor|corretora|avaliador|avaliadora|examinador|examinadora|monitor|monitora|tutor|tutora)\b",
        r"\b(car[oa]|prezad[oa]|ola|(nota|mensagem)\s+para)\s+(a\s+|o\s+)?(ia|inteligencia\s+artificial|assistente)\b",
        r"\b(se\s+)?(voce\s+e|tu\s+es)\s+(agora\s+)?(uma?|o|a)\s+(ia|corretor\w*|avaliador\w*|examinador\w*|"
        r"modelo\s+de\s+linguagem|inteligencia\s+artificial)\b",
        # Chinese
        r"阅卷|评分员|评分者|评分人|评分老师|批改老师|批改者|批改人|助教|考官|评卷|判卷",
        # Japanese: a grader spoken to, or told what it is
        r"(採点者|採点官|採点担当|評価者|試験官|添削者|先生)(様|さま|さん|殿|各位|へ)",
        r"(あなた|君|きみ)は[^。.\n]{0,10}?(ai|人工知能|言語モデル|採点者|評価者|アシスタント)|aiとして",
        r"(你是|您是|你现在是|如果你是)(?!否)[^。.\n]{0,8}?(ai|人工智能|语言模型|大模型|评分|批改|助手)"
        r"|作为(一个)?(ai|人工智能)",
    ]),
    ("poses as instructions", [
        r"\b(system|developer|admin(istrator)?)\s+(override|note|notice|update|alert)\b",
        # a system prompt, message or instructions as a heading or a label, in every language: an answer
        # about the system prompt (what it is, what it costs) names it inside a sentence
        rf"^[\s\[(<{{#*>|-]*({_SYSTEM_TERMS})\b|\b({_SYSTEM_TERMS})\s*[:=>\])]|[\[(<]\s*({_SYSTEM_TERMS})",
        r"\b(new|updated|real|actual|hidden|secret|true)\s+system\s+(prompt|message|instructions?)\b",
        r"\bnew\s+(instructions?|rubric|criteria|grading\s+(rules|instructions))\b",
        r"\byour\s+(new\s+)?(task|job|role|instructions?)\s+(is|are|now)\b",
        r"^\s*#{1,6}\s*(instructions?|system|response)\b",
        r"\bneue\s+anweisung\w*\b|\bnouvelles?\s+(instructions?|consignes?|regles)\b",
        r"\bnuevas?\s+(instrucciones|reglas|rubrica|criterios)\b|\bnovas?\s+(instrucoes|regras|rubrica|criterios)\b",
        r"开发者消息|新的指令|新指令|新しい指示|新たな指示|新しいルール",
    ]),
    ("poses as rubric or grade text", [
        r"^[-*#>\s]*((rubric|criteri(on|a)|grading|marking\s+scheme|grade|points|marks|verdict)\s*[:=]|score\s*:)",
        r"\bcriterion\s+[\w-]+\s*\(\s*\d+(\.\d+)?\s*points?\s*\)|\b(does\s+not\s+)?earns?\s+it\s*:",
        r"\b(reference\s+answer|misconceptions\s+the\s+course)\s*:",
        rf"\b(every|each|all)\s+(the\s+)?(criteri(on|a)|rubric\s+items?)\b{_GAP}\b(met|satisfied|fulfilled|achieved)\b",
        r"\b(updated|revised|corrected|amended|official)\s+"
        r"(rubric|criteria|marking\s+scheme|grading\s+(scheme|rules))\b",
        r"^[-*#>\s]*(bewertungsschema|bewertungskriterien|bewertung|kriteri(um|en)|punktzahl)\s*:",
        r"\b(alle\s+)?kriterien\s+(sind\s+)?(erfullt|erreicht)\b|\baktualisierte\s+(bewertung\w*|rubrik|kriterien)\b",
        r"^[-*#>\s]*(bareme|grille(\s+d'evaluation)?|criteres?)\s*:|\b(bareme|grille)\s+(mis\s+a\s+jour|officiel)\b",
        r"^[-*#>\s]*(rubrica|criterios?|puntuacion|calificacion)\s*:|\brubrica\s+(actualizada|oficial)\b",
        r"^[-*#>\s]*(评分标准|评分细则|评分规则|得分|分数)\s*:|(所有|全部)(评分)?标准(均|都)?(已)?(满足|达到)",
        r"^[-*#>\s]*(rubrica|criterios?)\s*:|\brubrica\s+(atualizada|oficial)\b|\btodos\s+os\s+criterios\s+"
        r"(foram\s+)?(cumpridos|atendidos|satisfeitos)\b",
        r"^[-*#>\s]*(採点基準|評価基準|ルーブリック|得点|点数)\s*:|(全て|すべて)の(基準|評価基準|採点基準)を?(満たし|満たす)",
    ]),
    ("states its own score", [
        r"\b\d+(\.\d+)?\s*/\s*\d+(\.\d+)?\s*(points?|marks?|pts)?\s*(awarded|earned|given|granted)\b",
        r"\b(points?|marks?|score|credit)\s+(awarded|earned|given|granted)\s*[:=]?\s*\d",
        r"\b(score|grade|mark|punkte|punktzahl|puntuacion|calificacion)\s*:\s*\d+([.,]\d+)?\s*(/|out\s+of|von)\s*\d+",
        r"\bnote\s*:\s*\d+([.,]\d+)?\s*sur\s*\d+",
        r"\bthis\s+(answer|response|submission)\s+(scores?|earns?|gets?|receives?|deserves?|merits?)\s+"
        r"\d+(\.\d+)?\s*(/\s*\d+|out\s+of\s+\d+|points?|marks?)",
        r"(得分|分数|评分)\s*:\s*\d+(\.\d+)?\s*/\s*\d+|(本题|此题|这道题|这个答案|本答案)(应得|得|获得)\s*\d+\s*分",
        r"\b(nota|pontuacao)\s*:\s*\d+([.,]\d+)?\s*(/|de)\s*\d+",
        r"(得点|点数|評価)\s*:\s*\d+(\.\d+)?\s*/\s*\d+|\d+\s*点満点中\s*\d+\s*点|この回答は\s*\d+\s*点",
    ]),
    ("imitates the data delimiters", [
        r"\b(end|begin|start)\s+(of\s+)?(the\s+)?student('?s)?\s+(data|answer|input|submission|response|text)\b",
        r"={3,}\s*(end|begin|start|stop)\b|\b(end|begin)\b[^\n]{0,40}={3,}",
        r"\bdata\s+only,?\s+never\s+instructions\b",
        r"</?(student[_ -]?data|student[_ -]?answer|answer|data|rubric|system|instructions?|user|assistant|human|"
        r"document|input|prompt|response|grade|grading|context|tool_result|tool_use|function_results?|"
        r"antml:[a-z_]+)\s*/?>",
        r"<\|\s*(im_start|im_end|endoftext|system|user|assistant|end|eot_id|start_header_id|end_header_id)\s*\|>",
        r"\[/?\s*(inst|sys|system)\s*\]|<<\s*/?\s*sys\s*>>",
        r"^[\s=#*\[(-]*(end|begin)\s+(of\s+)?(the\s+)?(data|input|answer|document|instructions?|prompt)"
        r"[\s=#*\])-]*$",
        r"\b(ende|beginn|anfang)\s+der\s+(studenten|studierenden|schuler)?(daten|antwort)\b",
        r"\b(fin|debut)\s+des\s+donnees\s+(de\s+l'|d'|des\s+)?(etudiant|eleve)"
        r"|^[\s=#*\[-]*(fin|debut)\s+des\s+donnees[\s=#*\]-]*$",
        r"\b(fin|inicio|comienzo)\s+de\s+los\s+datos\s+(del\s+)?(estudiante|alumno)"
        r"|^[\s=#*\[-]*(fin|inicio)\s+de\s+los\s+datos[\s=#*\]-]*$",
        r"(学生数据|学生答案|学生回答)(结束|开始|到此结束)|(结束|开始)(学生数据|学生答案)|数据结束",
        r"\b(fim|inicio|comeco)\s+dos\s+dados\s+(do\s+)?(estudante|aluno)"
        r"|^[\s=#*\[-]*(fim|inicio)\s+dos\s+dados[\s=#*\]-]*$",
        r"(学生|生徒)の?(データ|回答)の?(終了|開始|終わり|ここまで)|データ終了",
    ]),
    ("imitates the grader's own labels", [
        r"\babout\s+the\s+values\s*:|\bchecked\s+by\s+the\s+grader\b|\bthe\s+runs\s+were\s+not\s+compared\b",
        r"\bvalue\s+of\s+\w+\s+in\s+the\s+(grader's\s+run|student's\s+own\s+run)\b|\(the\s+student's\s+run\)",
        r"\bstudent\s+data\b|\bbegin\s+quotes\b|\bend\s+quotes\b",
    ]),
    ("names the grading tool", [
        r"\b(record_grade|injection_suspected|needs_review|record_screening|addresses_grader|tool_choice|"
        r"input_schema|record_confirmation)\b",
    ]),
    ("imitates a grade reply (JSON or a conversation turn)", [
        rf"\{{\s*{_Q}?(criteria|rationale|feedback|confidence|points|role|tool_use)\s*{_Q}?\s*:",
        rf"{_Q}(criteria|rationale|confidence|feedback){_Q}\s*:|{_Q}points{_Q}\s*:\s*\d",
        rf"{_Q}role{_Q}\s*:\s*{_Q}(assistant|system|user|tool){_Q}|{_Q}type{_Q}\s*:\s*{_Q}(tool_use|tool_result){_Q}",
        r"^\s*[*_\[]*(assistant|assistent|asistente|assistente|system|systeme|sistema|user|human|utilisateur|usuario|"
        r"benutzer|nutzer|developer)[*_\]]*\s*:",
        r"^\s*(助手|助理|系统|用户|人类|アシスタント|システム|ユーザー)\s*:",
    ]),
]
_PATTERNS = [(re.compile("|".join(f"(?:{p})" for p in patterns), re.MULTILINE), why) for why, patterns in _RULES]


# ----------------------------------------------------------------------------- the detector

def _said(words: str, limit: int = 60) -> str:
    """Words quoted in a reason, on one line and cut, so a TA sees what triggered it."""
    words = re.sub(r"\s+", " ", words).strip()
    return json.dumps(words if len(words) <= limit else words[:limit - 3] + "...", ensure_ascii=False)


def _as_written(span: str, text: str) -> str:
    """``span`` of the folded text as the student wrote it when it can be found there (case
    aside), else as the screen read it (the hiding undone, which is what a TA needs then)."""
    found = re.search(re.escape(span).replace("\\ ", r"\s+"), text, re.IGNORECASE)
    return found.group(0) if found else span


def _hits(folded: str, text: str, patterns: list[tuple[re.Pattern[str], str]]) -> list[tuple[str, str]]:
    """(class, reason quoting the words) for each pattern that matches ``folded``."""
    found = []
    for pattern, why in patterns:
        match = pattern.search(folded)
        if match:
            found.append((why, f"{why}: {_said(_as_written(match.group(0).strip(), text))}"))
    return found


def findings(text: str) -> list[tuple[str, str]]:
    """What in ``text`` addresses the grader: (the class, as ``_RULES`` names it or the hiding
    undone, and the reason a TA reads, quoting the words that triggered it)."""
    folded, hiding = readable(text)
    folded = folded.casefold()   # the patterns are lower case: faster than matching ignoring case
    return [(reason.split(":", 1)[0], reason) for reason in hiding] + _hits(folded, text, _PATTERNS)


def suspicious(text: str) -> list[str]:
    """Why ``text`` looks like it addresses the grader, each reason quoting the words that
    triggered it (empty: it does not)."""
    return [reason for _, reason in findings(text)]


# A JSON string literal; the last one may be cut by the size cap, mid-escape too.
_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)(?:"|\\?$)', re.DOTALL)
_CUT_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{0,3}$")


def _json_strings(text: str) -> Iterator[str]:
    """Every string literal of JSON text (keys included, at any depth), decoded. Reading the
    literals needs no parse, so neither deep nesting nor the cut at the size cap defeats it."""
    for match in _JSON_STRING.finditer(text):
        body = match.group(1)
        try:
            yield json.loads(f'"{body}"', strict=False)
        except ValueError:   # cut inside an escape by the size cap, or not JSON: read as written
            yield _CUT_ESCAPE.sub("", body)


def scan(answer: str, grounding: Mapping[str, str]) -> list[str]:
    """Why the student data of one request addresses the grader, as the model reads it: the
    answer, and each grounding value (the notebook's exported variable as JSON text) both as
    the JSON text sent and as each string in it, decoded; flags of a value are named by its
    variable. Only what the request carries is read (the same size caps); the grader's own
    labels and delimiters never are."""
    reasons = suspicious(answer[:MAX_ANSWER_CHARS])
    for name, value in grounding.items():
        if value == ABSENT:
            continue
        sent = value[:MAX_GROUNDING_CHARS]
        found: dict[str, str] = {}   # one reason per class: the JSON text and its strings often say it twice
        for text in (sent, *_json_strings(sent)):
            for why, reason in findings(text):
                found.setdefault(why, reason)
        reasons += [f"{name}: {reason}" for reason in found.values()]
    return reasons


# ----------------------------------------------------------------------------- languages

#: The languages the screen reads (its patterns are written in them and it tells them apart): the
#: ones a rubric may allow (``written.language``, ``written.other_languages``).
LANGUAGES = ANSWER_LANGUAGES
# Told apart too, so that a quote in one is named and not taken for a neighbour the course allows.
_RECOGNIZED = {**LANGUAGES, "it": "Italian", "nl": "Dutch"}
_LATIN_LANGUAGES = ("en", "de", "fr", "es", "pt", "it", "nl")
# The words every sentence of a language is made of (accents dropped, as the screen reads text):
# they tell the language apart where the word lists overlap, and cover the inflected forms that
# pyspellchecker's shorter lists (Spanish) leave out.
_FUNCTION_WORDS = {
    "en": "the a an of to in is are was were be been being and or but not no that this these those it its with for on "
          "at by from as than then so because which what when where who how can could should would will may might "
          "do does did has have had there their they we our us i my me you your he she his her one all each more "
          "most very also only if into over about after before why while both same other such own just",
    "de": "der die das den dem des ein eine einer eines einem einen und oder aber nicht kein keine ist sind war waren "
          "wird werden wurde hat haben hatte mit von zu zum zur im in am auf aus bei fur uber unter nach vor durch als "
          "wie wenn weil dass daher also auch nur noch schon sehr mehr ich wir du sie er es man mein meine unser "
          "unsere dieser diese dieses jeder jede jedes alle doch bleibt wachst pro ohne gegen bis sich dann denn "
          "wo was wer warum hier dort sein seine ihr ihre gibt kann konnen muss mussen soll",
    "fr": "le la les un une des du de et ou mais ne pas est sont etait etaient ete sera avec pour par sur dans en au "
          "aux ce cet cette ces qui que quoi dont il elle ils elles on nous vous je mon ma mes notre nos son sa ses "
          "leur leurs plus moins tres aussi donc car comme quand si tout tous toute toutes chaque sans entre lui "
          "ont avait fait peut reste croit grandit garde meme deja ici parce pourquoi",
    "es": "el la los las un una unos unas de del al y o pero no es son era eran fue sera esta estan estoy con para "
          "por en sobre entre que quien cual como cuando si muy mas menos tambien porque pues cada todo todos toda yo "
          "mi mis nosotros nuestro nuestra su sus se lo le les este esta estos estas ese esa eso hay tiene tienen "
          "crece creo sin hasta desde aunque ya donde mismo misma sigue queda guarda olvida puede pueden hace",
    "pt": "o a os as um uma uns umas de do da dos das no na nos nas ao aos e ou mas nao sao era eram foi sera esta "
          "estao estou com para por em sobre entre que quem qual como quando se muito mais menos tambem porque pois "
          "cada todo todos toda eu meu minha nosso nossa seu sua seus suas ele ela eles elas este isto esse essa "
          "isso ha tem cresce acho sem ate desde embora ja onde mesmo mesma continua fica guarda esquece pode podem "
          "faz pelo pela pelos pelas num numa",
    "it": "il lo la i gli le un una uno di del della dei degli delle al allo alla ai e o ma non sono era erano con "
          "per su tra fra che chi quale come quando se molto piu meno anche perche ogni tutto tutti questa questo "
          "questi quella quello io mio mia noi nostro suo sua loro ci si ne nel nella sul sulla",
    "nl": "de het een en of maar niet geen is zijn was waren wordt werd met van voor op in aan bij uit door als dan "
          "dat die deze dit wie wat waar hoe ook nog al zeer meer ik wij we jij je hij zij ze mijn ons onze hun elk "
          "elke alle er heeft hebben kan kunnen moet naar over",
}
_FUNCTION_SETS = {code: frozenset(words.split()) for code, words in _FUNCTION_WORDS.items()}
_WORD = re.compile(r"[^\W\d_]+")


def _fold(word: str) -> str:
    word = word.casefold()
    if word.isascii():   # most words: nothing to drop (and the word lists are long)
        return word
    return "".join(ch for ch in unicodedata.normalize("NFD", word) if unicodedata.category(ch) != "Mn")


@functools.cache
def _vocabulary(code: str) -> frozenset[str]:
    """The words of a language written in Latin letters, folded as the screen reads text: the
    pinned ``pyspellchecker`` package's word list for it, and its function words."""
    # read as the package stores it (the checker's own loading does work this check does not need)
    data = resources.files("spellchecker").joinpath("resources", f"{code}.json.gz").read_bytes()
    return frozenset(map(_fold, json.loads(gzip.decompress(data)))) | _FUNCTION_SETS[code]


def _prose_words(text: str) -> list[str]:
    """The words that say which language ``text`` is in: identifiers and code (a digit, an
    underscore or a dot inside), abbreviations (KV, MHA, GB) and single letters left out."""
    words = []
    for token in text.split():
        token = token.strip(".,;:!?()[]{}'\"\u201c\u201d\u2018\u2019\u00ab\u00bb*`")
        if not token or re.search(r"[\d_]|\w\.\w", token):
            continue
        for part in _WORD.findall(token):   # l'attention, state-of-the-art: one word each part
            if len(part) > 1 and not (part.isupper() and len(part) <= 6):
                words.append(_fold(part))
    return words


def _script(ch: str) -> str:
    """The script of a letter, as the language check needs it."""
    code = ord(ch)
    if ch.isascii() or 0x00C0 <= code <= 0x024F or 0x1E00 <= code <= 0x1EFF:
        return "latin"
    if 0x0370 <= code <= 0x03FF or 0x1F00 <= code <= 0x1FFF:
        return "greek"
    if 0x3040 <= code <= 0x30FF or 0x31F0 <= code <= 0x31FF:
        return "kana"
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF:
        return "han"
    return unicodedata.name(ch, "OTHER ?").split()[0].title()


def _course(codes: Sequence[str]) -> str:
    """The course's languages, as a reason names them."""
    names = [_RECOGNIZED[c] for c in codes]
    if len(names) == 1:
        return f"{names[0]}, the course's language"
    return ", ".join(names[:-1]) + " or " + names[-1] + ", the course's languages"


def quote_language(text: str, languages: Sequence[str] = ("en",)) -> tuple[str | None, str]:
    """The language of ``languages`` (the course's first) that ``text`` is read in, and why it is
    in none of them (empty when it is). (None, "") when too little of it is prose to tell:
    figures, formulas and code are in every language."""
    read = readable(text)[0]
    letters = [ch for ch in read if ch.isalpha()]
    scripts = Counter(_script(ch) for ch in letters if _script(ch) != "greek")   # Greek letters: symbols of maths
    counted = sum(scripts.values())
    allowed = [code for code in languages if code in LANGUAGES]
    if not counted:
        return None, ""
    other = [(n, name) for name, n in scripts.items() if name not in ("latin", "kana", "han")]
    if sum(n for n, _ in other) > 0.2 * counted:
        script = max(other)[1]
        return None, f"is in {script} script, not in {_course(allowed)}"
    if scripts["kana"] + scripts["han"] > 0.2 * counted:
        # kana is Japanese only; Han characters alone are read as Chinese unless only Japanese is allowed
        code = "ja" if scripts["kana"] or ("zh" not in allowed and "ja" in allowed) else "zh"
        return (code, "") if code in allowed else (None, f"is in {_RECOGNIZED[code]}, not in {_course(allowed)}")
    words = _prose_words(read)
    if len(words) < 4:
        return None, ""
    known = {code: sum(w in _vocabulary(code) for w in words) for code in _LATIN_LANGUAGES}
    # function words count twice: they tell neighbours apart (Spanish and Portuguese share content words)
    score = {code: known[code] + sum(w in _FUNCTION_SETS[code] for w in words) for code in known}
    best = max(score, key=score.__getitem__)
    latin = [code for code in allowed if code in known]
    # an allowed language the quote reads in, about as well as in any other (technical words are shared)
    fits = [code for code in latin if known[code] >= 0.5 * len(words) and score[code] >= score[best] - 0.2 * len(words)]
    if fits:
        return max(fits, key=score.__getitem__), ""
    if known[best] >= 0.5 * len(words):
        return None, f"is in {_RECOGNIZED[best]}, not in {_course(allowed)}"
    return None, f"is not in {_course(allowed)}"


# ----------------------------------------------------------------------------- a quote, on its own

# A quote is the model's evidence for a criterion: a short span that should be a statement about
# the subject. Read alone, anything else is easy to tell, and goes to a person (it is a reason to
# wait, not a flag): a request to the reader, talk of grading, text in an encoding, a language
# the course does not allow, the criterion's own words given back. Each rule is written in every
# language the screen reads.

# The course's own words, which name the grader, its instructions or a score without talking about
# grading this answer: they are read as a placeholder before the rules below.
_COURSE_WORDS = re.compile(
    r"\bthe\s+grader'?s'?\s+(own\s+)?(re-?runs?|runs?|sizes?|settings?|budgets?|lengths?|copy|machine|seeds?|numbers?|"
    r"figures?|timings?|values?|sweep|histories|steps|model|notebook|check)\b"
    r"|\bthe\s+grader\s+(re-?ran|re-?runs|ran|runs|uses|used|timed|times|measured|measures|seeds|seeded)\b"
    r"|\bgrading\s+(mode|run|budget|sizes?|settings?|lengths?|sweep|copy)\b|\bgrading_mode\b"
    r"|\b(the\s+)?(notebook|notebook's|exercise's|assignment's|question's|course's|task's|chat|model's|system's)\s+"
    r"instructions\b|\binstructions\s+(of|in)\s+the\s+(notebook|exercise|assignment|task)\b"
    r"|\binstruction[- ](tuned|tuning|following|following)\b|\bcredit\s+assignment\b"
    r"|\b(eviction|cache|caching|replacement|sampling|decoding|update|learning|greedy|routing|retention)\s+polic(y|ies)\b"
    r"|\b(full|all\s+the)\s+marks\s+(for|to)\s+(the|a|an|its|their|our)\s+(?!(answer|response|submission|student|attempt|"
    r"work|effort|question|essay|exercise)s?\b)[a-z]+"
    r"|\b(data|percentage|sample|grid|query|key|time)\s+points\b|\b\d+(\.\d+)?\s*points?\s+(of|in|along|on|apart)\b"
    # German, French, Spanish, Portuguese, Japanese, Chinese: the notebook's instructions, the grading run
    r"|\banweisungen\s+(des|im|aus\s+dem)\s+notebooks?\b|\bnotebook-anweisungen\b|\bbewertungslauf\w*"
    r"|\b(consignes|instructions)\s+du\s+(notebook|carnet|sujet)\b"
    r"|\binstrucciones\s+del\s+(notebook|cuaderno|enunciado)\b|\binstrucoes\s+do\s+(notebook|caderno|enunciado)\b"
    r"|\b(des|vom|dem|du|del|do|da)\s+graders?\b"
    r"|(ノートブック|課題)の指示|採点(用|時|モード)の?(サイズ|設定|実行|履歴)?|(notebook|笔记本|作业)的(指示|说明)"
    r"|评分函数|注意力评分|评分(器|程序|模式)(的)?(规模|尺寸|运行|设置)?")
_GRADING_TALK = re.compile(
    # "marks" as a noun (a verb of masks and markers otherwise); a policy of grading (a cache has one too)
    r"\b(rubrics?|criteri(on|a)|graders?|grading|marking|examiners?|credit|"
    r"(full|all|the|my|your|any|some|no|extra|bonus|maximum|max|top|these|those|\d+)\s+marks|"
    r"(deserves?|earns?|merits?|gets?|receives?|awarded|given|loses?)\s+(\w+\s+)?marks|"
    r"(course|class|late|submission|assessment|department|university)\s+polic(y|ies)|policy\s+(on|for)\s+"
    r"(grading|marking|answers|submissions)|"
    r"(your|these|those|new|following|grading|marking|the\s+grader'?s)\s+instructions|instructions\s*:|"
    r"assessment|evaluators?|(full|max(imum)?|all\s+the)\s+points|\d+(\.\d+)?\s*(/\s*\d+(\.\d+)?\s*)?(points?|pts)|"
    r"(score|grade|rate)\s+(this|my|the)\s+(answer|response|submission))\b"
    r"|\b(bewertung\w*|benotung|rubrik|kriteri(um|en)|korrektor\w*|prufer\w*|bewerter\w*|punktzahl|bestnote|"
    r"anweisung(en)?|\d+(\.\d+)?\s*punkte)\b"
    r"|\b(bareme|grille\s+d'evaluation|criteres?|correct(eur|rice)s?|evaluat(eur|rice)s?|notation|"
    r"(ma|une|la|sa|cette)\s+note\s+(sur|de)\s+\d+|note\s+(maximale|finale|parfaite)|consignes?|\d+(\.\d+)?\s*points|tous\s+les\s+points(?!\s+(de|du|des)\b))\b"
    r"|\b(rubrica|criterios?|correct(or|ora)(es)?|calificaci\w+|calificar|nota\s+(maxima|final|perfecta)|"
    r"instrucciones|evaluador\w*|puntaje|\d+(\.\d+)?\s*puntos|todos\s+los\s+puntos(?!\s+(de|del)\b))\b"
    r"|\b(corretor\w*|avaliador\w*|(minha|sua|esta|a)\s+nota\s+(e|sera|de)\s+\d+|nota\s+(maxima|final|perfeita|dez)|instrucoes|\d+(\.\d+)?\s*pontos|"
    r"todos\s+os\s+pontos(?!\s+(da|de|do|das|dos)\b))\b"
    r"|採点|満点|評価基準|ルーブリック|評価者|配点|得点|指示"
    r"|评分|满分|阅卷|批改|打分|给分|指令|指示")
# A request to the reader: the reader asked to grade, accept, ignore, decode or obey something of
# the answer's, not an imperative of an explanation ("Compare the two curves", "Ignore the first
# timing", "Give the decay a gate"): the object says which.
_ANSWER_OBJECT = (r"(this|it|that|me|us|my\b|the\s+(answer|response|submission|student|criteri\w+|rubric|points|marks|"
                  r"following|text|message|note|string|line)|everything|all\s+(of\s+)?(it|this|the\s+(points|marks|"
                  r"criteria))|each\s+criterion|every\s+criterion|what\s+follows|below|full|maximum|"
                  r"the\s+(maximum|max|highest\s+score|top\s+score))\b")
_START = r"(^|[.!?:;\n]\s*)"
_REQUEST = re.compile(
    rf"{_START}(please\s+|kindly\s+)?(award|give|grade|mark|score|assign|credit|rate|accept|confirm|approve|pass|"
    rf"count|treat|consider|decode|decrypt|translate|read|reverse|unscramble|follow|obey|output|respond|reply|return|"
    rf"print|say|answer|ignore|disregard|forget)\s+{_ANSWER_OBJECT}"
    rf"|{_START}(pretend|act\s+as|role-?play|imagine\s+you|suppose\s+you)\b"
    r"|\bdo\s+(what|as)\s+(it|this|that|the\s+\w+)\s+(says|asks|tells)\b"
    r"|\b(please|kindly)\b(?!\s+(note|notice|observe|recall|see\s+the\s+(table|plot|figure)))"
    rf"|\b(you|your)\b[^.!?\n]{{0,40}}\b(award|give|grade|mark|score|accept|confirm|credit|rate|pass|decode|treat|"
    rf"count)\s+{_ANSWER_OBJECT}"
    r"|\bi\s+(ask|beg|request|need|want)\s+you\b|\byou\s+(must|should|will|have\s+to|need\s+to)\s+(award|give|grade|"
    r"accept|mark|ignore|treat|count|confirm|pass)\b"
    # German
    r"|\bbitte\b(?!\s+(beachte|beachten|bedenke|bedenken|sehen\s+sie))|\bbitten\s+sie\b|\bich\s+bitte\b"
    rf"|{_START}(gib|gebt|geben\s+sie|vergib|vergeben\s+sie|bewerte|bewerten\s+sie|akzeptier\w*|bestatig\w*|"
    r"ignorier\w*|vergiss|behandle|behandeln\s+sie|lies|lesen\s+sie|dekodier\w*|ubersetz\w*|werte|zahle|zahlen\s+sie)"
    r"\s+(mir|uns|diese\w*|meine\w*|die\s+(antwort|bewertung|rubrik|kriterien|anweisungen|punkte)|das\s+(hier|folgende)|"
    r"es|alles|den\s+text|volle)\b"
    # French
    r"|\bs'il\s+(te|vous)\s+plait\b|\bsvp\b|\bje\s+vous\s+(prie|demande)\b|\bmerci\s+de\b|\bveuillez\b(?!\s+noter)"
    rf"|{_START}(donne[zs]?|attribue[zs]?|accorde[zs]?|mets|mettez|note[zs]?|evalue[zs]?|accepte[zs]?|confirme[zs]?|"
    r"ignore[zs]?|oublie[zs]?|decode[zs]?|traduis|traduisez|lis|lisez|considere[zs]?|traite[zs]?|compte[zs]?|suis|suivez)"
    r"[\s-]+(moi|nous|cette|ce\s+texte|ma|mon|la\s+reponse|tout|tous|ceci|cela|le\s+texte|les\s+(criteres|consignes|"
    r"instructions|points)|la\s+note)\b"
    # Spanish
    r"|\bpor\s+favor\b|\b(te|le|les|os)\s+(pido|ruego)\b"
    rf"|{_START}(da(me|le)?|de(me|le)|otorga\w*|asigna\w*|pon(me|le)?|califica\w*|evalua\w*|acepta\w*|confirma\w*|"
    r"ignora\w*|olvida\w*|decodifica\w*|traduce\w*|lee|considera\w*|trata\w*|cuenta|sigue)"
    r"\s+(esta|este|esto|mi|la\s+respuesta|todo|todos|los\s+puntos|el\s+texto|las\s+(instrucciones|reglas)|"
    r"la\s+(nota|puntuacion)\s+maxima)\b"
    # Portuguese
    r"|\bpor\s+favor\b|\b(peco|pedimos)\s+(que|a\s+voce|ao)\b"
    rf"|{_START}(de|deem|da|atribua\w*|conceda\w*|coloque|avalie|aceite|confirme|ignore|esqueca|decodifique|traduza|"
    r"leia|considere|trate|conte|siga)[\s-]+(-?me|esta|este|isto|minha|meu|a\s+resposta|tudo|todos|os\s+pontos|"
    r"o\s+texto|as\s+(instrucoes|regras)|a\s+nota\s+maxima|nota\s+maxima)\b"
    # Japanese and Chinese: a grade, a pass or obedience asked for
    r"|(満点|点数|得点|評価|採点|合格|正解|高評価)[^。.!?\n]{0,12}?(ください|下さい|てほしい|て欲しい|お願い|願います|なさい)"
    r"|(無視|従って|解読|翻訳)[^。.!?\n]{0,6}?(ください|下さい|なさい|しろ|せよ)"
    r"|(请|麻烦|务必|拜托|恳请)[^。.!?\n]{0,12}?(给|打|评|判|接受|确认|忽略|无视|解码|翻译|按照|视为|算作|通过)")
_BASE64 = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")
_HEX = re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{16,}\b")
_LEET = str.maketrans("013457@$|", "oieastasl")
_LEET_WORD = re.compile(r"\b(?=\w*[a-z])(?=\w*[013457])[a-z013457@$|]{3,}\b")
_ROT13 = str.maketrans("abcdefghijklmnopqrstuvwxyz", "nopqrstuvwxyzabcdefghijklm")
# A rubric's criteria are sentences about an answer with its subject left out ("Explains that ...",
# "Reports the crossover ..."): an answer states things, it does not describe itself that way.
_RUBRIC_GRAMMAR = re.compile(
    r"(^|[.!?;:]\s+|\n\s*)(explains|reports|states|says|derives|notes|names|identifies|describes|argues|shows|"
    r"compares|quotes|mentions|asserts|recognizes|recognises|relates|connects|distinguishes|claims|gives|omits|"
    r"misses|earns)\s+(that|the|why|how|a|an|both|each|its|what|which)\b")


def _encoded(token: str) -> bool:
    """A long run of base64's alphabet that is no word or identifier: digits or symbols in it, or
    capitals that no naming convention puts there (a camel-case name has a few)."""
    letters = [ch for ch in token if ch.isalpha()]
    capitals = sum(ch.isupper() for ch in letters)
    return bool(re.search(r"[0-9+/=]", token)) and len(letters) > len(token) // 2 or (
        letters and 0.3 <= capitals / len(letters) <= 0.8)


# A quote about the answer itself (this answer counts, my other answer) or pointing elsewhere says
# nothing about the subject. "In this answer, T is the history length" is about the subject.
_SELF_REFERENCE = re.compile(
    r"\b(the\s+other|the\s+previous|the\s+next|the\s+first|my\s+(first|other|previous|next|last))\s+"
    r"(answer|response|submission)s?\b|\b(this|that)\s+one\s+counts\b"
    r"|\b(this|my)\s+(answer|response|submission)\s+(counts|deserves|meets|earns|gets|should\s+get|must\s+get|"
    r"qualifies|satisfies|fulfils|fulfills|covers\s+(every|all)|is\s+(complete|correct|full|perfect|right))\b"
    r"|\b(see|refer\s+to|check|read)\s+(the|my)\s+(notes?|comments?|values?|results?|report|output|other|previous|first|"
    r"next)\b"
    r"|\b(diese|meine)\s+antwort\s+(verdient|erfullt|ist\s+(vollstandig|korrekt|richtig))\b|\bmeine\s+(andere|erste|"
    r"vorige)\s+antwort\b"
    r"|\b(cette|ma)\s+reponse\s+(merite|remplit|satisfait|est\s+(complete|correcte|juste))\b|\bmon\s+autre\s+reponse\b"
    r"|\b(esta|mi)\s+respuesta\s+(merece|cumple|satisface|esta\s+completa|es\s+correcta)\b|\bmi\s+otra\s+respuesta\b"
    r"|\b(esta|minha)\s+resposta\s+(merece|cumpre|satisfaz|esta\s+completa|e\s+correta)\b|\bminha\s+outra\s+resposta\b"
    r"|この回答は[^。\n]{0,8}?(満点|正解|完全|合格)|(这个|本|此)答案[^。\n]{0,6}?(应该|值得|应得|满足|是正确|是完整)")


def quote_problems(quote: str, languages: Sequence[str] = ("en",)) -> list[str]:
    """Why a quote given as evidence is not a plain statement about the subject in one of
    ``languages`` (the course's first), each reason quoting the words that say so (empty: it is)."""
    text, hiding = readable(quote)
    folded = text.casefold()
    problems = list(hiding) + [reason for _, reason in _hits(folded, quote, _PATTERNS)]
    plain = _COURSE_WORDS.sub(" _ ", folded)
    deleeted = _LEET_WORD.sub(lambda m: m.group(0).translate(_LEET), plain)
    readings = [(plain, ""), (plain.translate(_ROT13), " (read in rot13)")]
    if deleeted != plain:
        readings.insert(1, (deleeted, " (read as leetspeak)"))
    for reading, how in readings:
        # another reading reports only what the plain one does not show (rot13 leaves CJK as it is)
        for pattern, why in ((_GRADING_TALK, "talks about grading"), (_REQUEST, "asks the reader to do something")):
            match = pattern.search(reading)
            if match and not (how and pattern.search(plain)):
                words = match.group(0).strip(" .!?:;")
                problems.append(f"{why}{how}: {_said(words if how else _as_written(words, quote))}")
        if how:
            problems += [f"addresses the grader{how}: {_said(m.group(0))}" for pattern, _ in _PATTERNS
                         if (m := pattern.search(reading)) and not pattern.search(folded)][:1]
    encoded = [token for token in _BASE64.findall(quote) if _encoded(token)] + _HEX.findall(quote)
    if encoded:
        problems.append(f"holds encoded text: {_said(encoded[0], 30)}")
    _, wrong_language = quote_language(quote, languages)
    if wrong_language:
        problems.append(wrong_language)
    for pattern, why in ((_SELF_REFERENCE, "is about the answer itself or points elsewhere, not about the subject"),
                         (_RUBRIC_GRAMMAR, "describes an answer, as a rubric does, instead of answering")):
        match = pattern.search(folded)
        if match:
            problems.append(f"{why}: {_said(_as_written(match.group(0).strip(' .!?:;'), quote))}")
    return list(dict.fromkeys(problems))
