/* json.h - a small, strict JSON reader shared by the model loader (config.json,
 * safetensors headers, the shard index) and the tokenizer (tokenizer.json).
 *
 * The whole document is parsed once into a tree of JsonValue nodes that live in
 * one arena owned by the Json object; strings are decoded (escapes, \uXXXX with
 * surrogate pairs) into NUL-terminated UTF-8 copies. Children of arrays and
 * objects are a singly linked list in document order, so a reader walks them
 * with `for (v = obj->child; v; v = v->next)`; object members carry their key.
 *
 * Strictness matters because every input here may be hostile (fuzzed): depth is
 * bounded, numbers follow the JSON grammar exactly, invalid UTF-8 inside strings
 * and unpaired surrogates are rejected, and trailing garbage is an error. */
#ifndef GLM_JSON_H
#define GLM_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue {
    const char *key;          /* member name when the parent is an object, else NULL */
    struct JsonValue *next;   /* next sibling */
    union {
        struct { const char *str; size_t str_len; };     /* JSON_STRING: decoded UTF-8, NUL-terminated */
        struct { struct JsonValue *child; size_t n; };   /* JSON_ARRAY / JSON_OBJECT: first child, count */
        double num;                                      /* JSON_NUMBER; JSON_BOOL: 0 or 1 */
    };
    uint64_t u64;             /* JSON_NUMBER with is_uint: the exact value */
    uint32_t key_len;         /* bytes in key (keys may contain NUL via \u0000) */
    uint8_t type;             /* a JsonType */
    uint8_t is_uint;          /* JSON_NUMBER written as a plain non-negative integer that fits uint64 */
} JsonValue;                  /* 48 bytes: tokenizer.json alone has 1.3 M of these */

typedef struct {
    JsonValue *root;
    void *arena;              /* private: the blocks that hold nodes and strings */
} Json;

/* Parses text[0..len). Returns 0 on success; on failure returns -1 and writes a
 * one-line reason with the byte offset into err. */
int json_parse(Json *j, const char *text, size_t len, char *err, size_t errlen);
void json_free(Json *j);

/* Member of an object by key (first match), or NULL. */
const JsonValue *json_get(const JsonValue *obj, const char *key);
/* i-th element of an array, or NULL. */
const JsonValue *json_at(const JsonValue *arr, size_t i);

#endif
