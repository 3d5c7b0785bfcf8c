"""A deterministic detector of student data that addresses the grader instead of the question.

It runs at grade time on every answer that would be sent, whatever ``--llm`` says, and again
beside the model's own flag when a draft is made: flagged data is still graded on its
content, but the item gains no points until a TA confirms the suggested score.

Text is first brought to what a reader (a person or a model) takes it for: escapes written
out (``\\u0069``, ``&#105;``) are decoded, Unicode tag characters are decoded to the ASCII they
encode, invisible and direction-changing characters are removed (their presence is itself a
flag), then NFKC folds full-width and other compatibility forms, accents and combining marks
are dropped, and letters that look like Latin ones (UTS #39 confusables: Cyrillic "а", Greek
"ο"; small capitals) become those Latin letters. The patterns then look, in English,
German, French, Spanish and Chinese, for the forms seen in practice: orders to ignore the
instructions, requests for marks, notes to the marker / examiner / TA / AI, text posing as the
rubric, the system or a grade, imitations of the data delimiters and of the grader's reply.
They are kept narrow so that honest answers about attention scores, models and prompts pass
(tests/test_injection.py runs them over the course's reference and TA-scored answers).
"""
from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterator, Mapping
from importlib import resources

from spellchecker import SpellChecker

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
    """``text`` as the patterns read it, and what hiding was undone on the way (reasons)."""
    reasons = []
    text = _unescape(text)
    if _TAGS.search(text):
        reasons.append(TAGGED)
        text = _TAGS.sub(_untag, text)
    hidden = {i for i in range(len(text)) if _invisible(text, i)}
    if hidden:
        reasons.append(INVISIBLE)
        text = "".join(ch for i, ch in enumerate(text) if i not in hidden)
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Mn", "Me"))   # accents, marks
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
        # Chinese
        r"(忽略|忽视|无视|不要理会|不理会|别理会|不要遵循|不要遵守|忘记|忘掉|抛开|跳过)[^。.\n]{0,12}?"
        r"(指令|指示|说明|规则|要求|提示词|提示|评分标准|评分规则|评分细则|评分准则)",
    ]),
    ("asks for marks", [
        # English
        rf"\b(award|grant)\b{_GAP}{_ALL_MARKS_EN}",
        rf"{_GIVE_EN}{_GAP}{_ALL_MARKS_EN}",
        r"\b(full|maximum|max|top)\s+(marks|credit)\b|\bfull\s+points\b|\ball\s+(the\s+)?marks\b",
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
        # Chinese
        r"满分|(给|打|评|判|授予|给予)[^。.\n]{0,10}?(最高分|全部分数|所有分数|全分)",
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
        # Chinese
        r"阅卷|评分员|评分者|评分人|评分老师|批改老师|批改者|批改人|助教|考官|评卷|判卷",
        r"(你是|您是|你现在是|如果你是)(?!否)[^。.\n]{0,8}?(ai|人工智能|语言模型|大模型|评分|批改|助手)"
        r"|作为(一个)?(ai|人工智能)",
    ]),
    ("poses as instructions", [
        r"\b(system|developer|admin(istrator)?)\s+(prompt|message|instructions?|override|note|notice)\b",
        r"\bnew\s+(instructions?|rubric|criteria|grading\s+(rules|instructions))\b",
        r"\byour\s+(new\s+)?(task|job|role|instructions?)\s+(is|are|now)\b",
        r"^\s*#{1,6}\s*(instructions?|system|response)\b",
        r"\b(systemanweisung\w*|systemnachricht\w*|systemprompt|neue\s+anweisung\w*)\b",
        r"\b(message|invite|prompt|instructions?)\s+systeme\b|\bnouvelles?\s+(instructions?|consignes?|regles)\b",
        r"\b(mensaje|instrucciones?|prompt)\s+del\s+sistema\b|\bnuevas?\s+(instrucciones|reglas|rubrica|criterios)\b",
        r"系统提示|系统消息|系统指令|开发者消息|新的指令|新指令",
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
    ]),
    ("states its own score", [
        r"\b\d+(\.\d+)?\s*/\s*\d+(\.\d+)?\s*(points?|marks?|pts)?\s*(awarded|earned|given|granted)\b",
        r"\b(points?|marks?|score|credit)\s+(awarded|earned|given|granted)\s*[:=]?\s*\d",
        r"\b(score|grade|mark|punkte|punktzahl|puntuacion|calificacion)\s*:\s*\d+([.,]\d+)?\s*(/|out\s+of|von)\s*\d+",
        r"\bnote\s*:\s*\d+([.,]\d+)?\s*sur\s*\d+",
        r"\bthis\s+(answer|response|submission)\s+(scores?|earns?|gets?|receives?|deserves?|merits?)\s+"
        r"\d+(\.\d+)?\s*(/\s*\d+|out\s+of\s+\d+|points?|marks?)",
        r"(得分|分数|评分)\s*:\s*\d+(\.\d+)?\s*/\s*\d+|(本题|此题|这道题|这个答案|本答案)(应得|得|获得)\s*\d+\s*分",
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
        r"^\s*[*_\[]*(assistant|assistent|asistente|system|systeme|sistema|user|human|utilisateur|usuario|benutzer|"
        r"nutzer|developer)[*_\]]*\s*:",
        r"^\s*(助手|助理|系统|用户|人类)\s*:",
    ]),
]
_PATTERNS = [(re.compile("|".join(f"(?:{p})" for p in patterns), re.MULTILINE), why) for why, patterns in _RULES]


# ----------------------------------------------------------------------------- the detector

def suspicious(text: str) -> list[str]:
    """Why ``text`` looks like it addresses the grader (empty: it does not)."""
    folded, reasons = readable(text)
    folded = folded.casefold()   # the patterns are lower case: faster than matching ignoring case
    return reasons + [why for pattern, why in _PATTERNS if pattern.search(folded)]


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
        found = dict.fromkeys(why for text in (sent, *_json_strings(sent)) for why in suspicious(text))
        reasons += [f"{name}: {why}" for why in found]
    return reasons


# ----------------------------------------------------------------------------- a quote, on its own

# A quote is the model's evidence for a criterion: a short span that should be a statement about
# the subject. Read alone, anything else is easy to tell, and goes to a person (it is a reason to
# wait, not a flag): a request to the reader, talk of grading, text in an encoding, another
# language than the course's, the criterion's own words given back.
_GRADING_TALK = re.compile(
    r"\b(rubrics?|criteri(on|a)|graders?(?!'s\s+(re-?)?run)|grading|marking|examiners?|marks|credit|instructions?|"
    r"policy|"
    r"assessment|evaluators?|(full|max(imum)?|all\s+the)\s+points|\d+(\.\d+)?\s*(/\s*\d+(\.\d+)?\s*)?(points?|pts)|"
    r"(score|grade|rate)\s+(this|my|the)\s+(answer|response|submission))\b")
_REQUEST = re.compile(
    r"(^|[.!?:;\n]\s*)(please\s+|kindly\s+)?(award|give|grade|mark|score|assign|credit|rate|accept|confirm|approve|"
    r"pass|ignore|disregard|forget|decode|decrypt|translate|treat|count|follow|output|respond|reply|return|print|"
    r"pretend|act\s+as|read\s+(this|my|the\s+following)|consider\s+this\s+(answer|response))\b"
    r"|\b(please|kindly)\b|\b(you|your)\b[^.!?\n]{0,40}\b(award|give|grade|mark|score|accept|confirm|credit|rate|"
    r"pass|decode|treat|count)\b")
_BASE64 = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")
_HEX = re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{16,}\b")
_LEET = str.maketrans("013457@$|", "oieastasl")
_LEET_WORD = re.compile(r"\b(?=\w*[a-z])(?=\w*[013457])[a-z013457@$|]{3,}\b")
_ROT13 = str.maketrans("abcdefghijklmnopqrstuvwxyz", "nopqrstuvwxyzabcdefghijklm")
_WORD = re.compile(r"[^\W\d_]+")
# A rubric's criteria are sentences about an answer with its subject left out ("Explains that ...",
# "Reports the crossover ..."): an answer states things, it does not describe itself that way.
_RUBRIC_GRAMMAR = re.compile(
    r"(^|[.!?;:]\s+|\n\s*)(explains|reports|states|says|derives|notes|names|identifies|describes|argues|shows|"
    r"compares|quotes|mentions|asserts|recognizes|recognises|relates|connects|distinguishes|claims|gives|omits|"
    r"misses|earns)\s+(that|the|why|how|a|an|both|each|its|what|which)\b")
_OTHER_SCRIPTS = re.compile(r"[^\W\d_a-zA-Z\u0370-\u03ff\u4e00-\u9fff]")   # letters neither Latin, Greek nor Han


@functools.cache
def _english() -> SpellChecker:
    """The pinned ``pyspellchecker`` package's English word list: most prose words of an English
    quote are in it, technical terms aside; few of another language's are."""
    return SpellChecker(language="en", distance=1)


def _encoded(token: str) -> bool:
    """A long run of base64's alphabet that is no word or identifier: digits or symbols in it, or
    capitals that no naming convention puts there (a camel-case name has a few)."""
    letters = [ch for ch in token if ch.isalpha()]
    capitals = sum(ch.isupper() for ch in letters)
    return bool(re.search(r"[0-9+/=]", token)) and len(letters) > len(token) // 2 or (
        letters and 0.3 <= capitals / len(letters) <= 0.8)


# A quote about the answer itself (this answer, my other answer) says nothing about the subject.
_SELF_REFERENCE = re.compile(r"\b(this|my|the\s+other|the\s+previous|the\s+next|the\s+first|my\s+(first|other|"
                             r"previous|next))\s+(answer|response|submission)s?\b"
                             r"|\b(see|refer\s+to|check|read)\s+(the|my)\s+(notes?|comments?|values?|results?|report|"
                             r"output|other|previous|first|next)\b")


def quote_problems(quote: str) -> list[str]:
    """Why a quote given as evidence is not a plain statement about the subject (empty: it is)."""
    folded, hiding = readable(quote)
    folded = folded.casefold()
    problems = list(hiding) + [why for pattern, why in _PATTERNS if pattern.search(folded)]
    deleeted = _LEET_WORD.sub(lambda m: m.group(0).translate(_LEET), folded)
    readings = [(folded, ""), (folded.translate(_ROT13), " (read in rot13)")]
    if deleeted != folded:
        readings.insert(1, (deleeted, " (read as leetspeak)"))
    for text, how in readings:
        if _GRADING_TALK.search(text):
            problems.append(f"talks about grading{how}")
        if _REQUEST.search(text):
            problems.append(f"asks the reader to do something{how}")
        if how and any(pattern.search(text) for pattern, _ in _PATTERNS):
            problems.append(f"addresses the grader{how}")
    if any(_encoded(token) for token in _BASE64.findall(quote)) or _HEX.search(quote):
        problems.append("holds encoded text")
    # prose words only: identifiers and code (a dot, an underscore or a digit inside) say nothing of the language
    words = [w.strip(".,;:!?()[]'\"") for w in folded.split()]
    words = [w for w in words if len(w) > 1 and _WORD.fullmatch(w)]
    letters = [ch for ch in folded if ch.isalpha()]
    if letters and sum(bool(_OTHER_SCRIPTS.match(ch)) for ch in letters) > 0.2 * len(letters):
        problems.append("is in a script the confirmation does not read")
    elif len(words) >= 4 and len(_english().known(words)) < 0.5 * len(words):
        problems.append("is not in English, the course's language")
    if _SELF_REFERENCE.search(folded):
        problems.append("is about the answer itself or points elsewhere, not about the subject")
    if _RUBRIC_GRAMMAR.search(folded):
        problems.append("describes an answer, as a rubric does, instead of answering")
    return list(dict.fromkeys(problems))
