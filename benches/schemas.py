"""JSON schemas that structured-output clients send: the structured-output tests and the grammar benchmarks
use this set (nested objects, arrays with item bounds, enums, integers and numbers, booleans, required and
optional keys, additionalProperties false)."""

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999999},
        "status": {"enum": ["pending", "shipped", "delivered"]},
        "paid": {"type": "boolean"},
        "total": {"type": "number", "minimum": 0, "maximum": 10000},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["id", "status", "paid", "items"],
    "additionalProperties": False,
}

TAGS = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 2,
                            "maxItems": 4}},
    "required": ["tags"],
    "additionalProperties": False,
}

# one path only: every step has exactly one allowed token sequence
SINGLE_PATH = {"type": "object", "properties": {"answer": {"const": "yes"}}, "required": ["answer"],
               "additionalProperties": False}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}

SCHEMAS = {"person": PERSON, "order": ORDER, "tags": TAGS, "single_path": SINGLE_PATH}
