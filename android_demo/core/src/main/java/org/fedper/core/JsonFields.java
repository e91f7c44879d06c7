package org.fedper.core;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;
import org.json.JSONTokener;

/**
 * Typed reads from an org.json object (Android's built-in JSON; on the host JVM Debian's
 * libandroid-json-java, the same code). Every bad or missing field is an
 * IllegalArgumentException naming the file and the field's dotted path, never a cast failure.
 */
final class JsonFields {
  private final JSONObject object;
  private final String file;
  private final String path;

  private JsonFields(JSONObject object, String file, String path) {
    this.object = object;
    this.file = file;
    this.path = path;
  }

  /** Parses text holding exactly one JSON object (trailing whitespace allowed, nothing else). */
  static JsonFields parse(String text, String file) {
    return new JsonFields(parseObject(text, file), file, "");
  }

  static JSONObject parseObject(String text, String file) {
    try {
      JSONTokener tokens = new JSONTokener(text);
      Object value = tokens.nextValue();
      if (!(value instanceof JSONObject)) {
        throw new IllegalArgumentException(file + " is not a JSON object");
      }
      if (tokens.nextClean() != '\0') {
        throw new IllegalArgumentException(file + " has characters after its JSON object");
      }
      return (JSONObject) value;
    } catch (JSONException ex) {
      throw new IllegalArgumentException(file + " is not valid JSON: " + ex.getMessage(), ex);
    }
  }

  JSONObject json() {
    return object;
  }

  boolean has(String key) {
    return object.has(key) && !object.isNull(key);
  }

  String where(String key) {
    return file + ": field '" + (path.isEmpty() ? key : path + "." + key) + "'";
  }

  private Object required(String key) {
    if (!has(key)) {
      throw new IllegalArgumentException(where(key) + " is missing");
    }
    return object.opt(key);
  }

  JsonFields object(String key) {
    Object v = required(key);
    if (!(v instanceof JSONObject)) {
      throw new IllegalArgumentException(where(key) + " must be an object, got " + v);
    }
    return new JsonFields((JSONObject) v, file, path.isEmpty() ? key : path + "." + key);
  }

  String string(String key) {
    Object v = required(key);
    if (!(v instanceof String)) {
      throw new IllegalArgumentException(where(key) + " must be a string, got " + v);
    }
    return (String) v;
  }

  String string(String key, String absent) {
    return has(key) ? string(key) : absent;
  }

  /** A string that must be one of the allowed values (absent: the first one). */
  String choice(String key, String... allowed) {
    String v = string(key, allowed[0]);
    for (String a : allowed) {
      if (a.equals(v)) {
        return v;
      }
    }
    throw new IllegalArgumentException(where(key) + " is \"" + v + "\", expected one of " + String.join(", ", allowed));
  }

  double number(String key, double absent) {
    return has(key) ? number(key) : absent;
  }

  double number(String key) {
    Object v = required(key);
    if (!(v instanceof Number)) {
      throw new IllegalArgumentException(where(key) + " must be a number, got " + v);
    }
    return ((Number) v).doubleValue();
  }

  long integer(String key) {
    Object v = required(key);
    return integral(v, where(key));
  }

  int integer(String key, int absent) {
    return has(key) ? Math.toIntExact(integer(key)) : absent;
  }

  JSONArray array(String key) {
    Object v = required(key);
    if (!(v instanceof JSONArray)) {
      throw new IllegalArgumentException(where(key) + " must be a list, got " + v);
    }
    return (JSONArray) v;
  }

  List<String> strings(String key) {
    JSONArray a = array(key);
    List<String> out = new ArrayList<>();
    for (int k = 0; k < a.length(); k++) {
      Object v = a.opt(k);
      if (!(v instanceof String)) {
        throw new IllegalArgumentException(where(key) + "[" + k + "] must be a string, got " + v);
      }
      out.add((String) v);
    }
    return Collections.unmodifiableList(out);
  }

  float[] floats(String key, int length) {
    JSONArray a = array(key);
    if (a.length() != length) {
      throw new IllegalArgumentException(where(key) + " must hold " + length + " numbers, has " + a.length());
    }
    float[] out = new float[length];
    for (int k = 0; k < length; k++) {
      Object v = a.opt(k);
      if (!(v instanceof Number)) {
        throw new IllegalArgumentException(where(key) + "[" + k + "] must be a number, got " + v);
      }
      out[k] = ((Number) v).floatValue();
    }
    return out;
  }

  long[] longs(String key) {
    JSONArray a = array(key);
    long[] out = new long[a.length()];
    for (int k = 0; k < out.length; k++) {
      out[k] = integral(a.opt(k), where(key) + "[" + k + "]");
    }
    return out;
  }

  /** Every value of an object field as a string (for string-to-string maps). */
  Map<String, String> stringMap(String key) {
    JsonFields o = object(key);
    Map<String, String> out = new LinkedHashMap<>();
    for (String k : o.object.keySet()) {
      out.put(k, o.string(k));
    }
    return Collections.unmodifiableMap(out);
  }

  /** An object field as a shallow map of plain Java values (JSON null becomes null). */
  Map<String, Object> plainMap(String key) {
    if (!has(key)) {
      return Collections.emptyMap();
    }
    JSONObject o = object(key).object;
    Map<String, Object> out = new LinkedHashMap<>();
    for (String k : o.keySet()) {
      out.put(k, o.isNull(k) ? null : o.opt(k));
    }
    return Collections.unmodifiableMap(out);
  }

  /** The field's dotted path of an entry of a list of objects, for nested reads. */
  JsonFields element(String key, int index) {
    Object v = array(key).opt(index);
    if (!(v instanceof JSONObject)) {
      throw new IllegalArgumentException(where(key) + "[" + index + "] must be an object, got " + v);
    }
    return new JsonFields((JSONObject) v, file, (path.isEmpty() ? key : path + "." + key) + "[" + index + "]");
  }

  static long integral(Object v, String where) {
    if (v instanceof Integer || v instanceof Long) {
      return ((Number) v).longValue();
    }
    if (v instanceof Number) {
      double d = ((Number) v).doubleValue();
      if (d == Math.rint(d) && Math.abs(d) < 0x1p53) {
        return (long) d;
      }
    }
    throw new IllegalArgumentException(where + " must be an integer, got " + v);
  }
}
