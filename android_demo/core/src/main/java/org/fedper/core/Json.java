package org.fedper.core;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small JSON reader and writer, so that the core needs nothing beyond the JDK (and Android's
 * org.json differs from the JVM's). Objects keep their key order; numbers are read as Long when
 * integral, else Double.
 */
public final class Json {
  private final String s;
  private int i;

  private Json(String s) {
    this.s = s;
  }

  /** Parses one JSON value; throws IllegalArgumentException naming the offset of bad input. */
  public static Object parse(String text) {
    Json p = new Json(text);
    p.skipWhitespace();
    Object value = p.value();
    p.skipWhitespace();
    if (p.i != text.length()) {
      throw p.error("trailing characters");
    }
    return value;
  }

  @SuppressWarnings("unchecked")
  public static Map<String, Object> parseObject(String text) {
    Object value = parse(text);
    if (!(value instanceof Map)) {
      throw new IllegalArgumentException("expected a JSON object");
    }
    return (Map<String, Object>) value;
  }

  private IllegalArgumentException error(String what) {
    return new IllegalArgumentException("bad JSON at offset " + i + ": " + what);
  }

  private void skipWhitespace() {
    while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
      i++;
    }
  }

  private Object value() {
    if (i >= s.length()) {
      throw error("unexpected end");
    }
    char c = s.charAt(i);
    switch (c) {
      case '{':
        return object();
      case '[':
        return array();
      case '"':
        return string();
      case 't':
        return literal("true", Boolean.TRUE);
      case 'f':
        return literal("false", Boolean.FALSE);
      case 'n':
        return literal("null", null);
      default:
        return number();
    }
  }

  private Object literal(String word, Object value) {
    if (!s.startsWith(word, i)) {
      throw error("expected " + word);
    }
    i += word.length();
    return value;
  }

  private Map<String, Object> object() {
    Map<String, Object> out = new LinkedHashMap<>();
    i++;
    skipWhitespace();
    if (i < s.length() && s.charAt(i) == '}') {
      i++;
      return out;
    }
    while (true) {
      skipWhitespace();
      if (i >= s.length() || s.charAt(i) != '"') {
        throw error("expected a key");
      }
      String key = string();
      skipWhitespace();
      expect(':');
      skipWhitespace();
      out.put(key, value());
      skipWhitespace();
      if (i < s.length() && s.charAt(i) == ',') {
        i++;
        continue;
      }
      expect('}');
      return out;
    }
  }

  private List<Object> array() {
    List<Object> out = new ArrayList<>();
    i++;
    skipWhitespace();
    if (i < s.length() && s.charAt(i) == ']') {
      i++;
      return out;
    }
    while (true) {
      skipWhitespace();
      out.add(value());
      skipWhitespace();
      if (i < s.length() && s.charAt(i) == ',') {
        i++;
        continue;
      }
      expect(']');
      return out;
    }
  }

  private void expect(char c) {
    if (i >= s.length() || s.charAt(i) != c) {
      throw error("expected '" + c + "'");
    }
    i++;
  }

  private String string() {
    StringBuilder out = new StringBuilder();
    i++;
    while (true) {
      if (i >= s.length()) {
        throw error("unterminated string");
      }
      char c = s.charAt(i++);
      if (c == '"') {
        return out.toString();
      }
      if (c != '\\') {
        out.append(c);
        continue;
      }
      if (i >= s.length()) {
        throw error("unterminated escape");
      }
      char e = s.charAt(i++);
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.append(e);
          break;
        case 'b':
          out.append('\b');
          break;
        case 'f':
          out.append('\f');
          break;
        case 'n':
          out.append('\n');
          break;
        case 'r':
          out.append('\r');
          break;
        case 't':
          out.append('\t');
          break;
        case 'u':
          if (i + 4 > s.length()) {
            throw error("short \\u escape");
          }
          out.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
          i += 4;
          break;
        default:
          throw error("bad escape \\" + e);
      }
    }
  }

  private Object number() {
    int start = i;
    while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
      i++;
    }
    String text = s.substring(start, i);
    if (text.isEmpty()) {
      throw error("unexpected character '" + s.charAt(start) + "'");
    }
    try {
      if (text.contains(".") || text.contains("e") || text.contains("E")) {
        return Double.parseDouble(text);
      }
      return Long.parseLong(text);
    } catch (NumberFormatException ex) {
      throw error("bad number " + text);
    }
  }

  /** Serializes maps, lists, strings, numbers, booleans and null. */
  public static String write(Object value) {
    StringBuilder out = new StringBuilder();
    write(value, out);
    return out.toString();
  }

  private static void write(Object value, StringBuilder out) {
    if (value == null) {
      out.append("null");
    } else if (value instanceof String) {
      quote((String) value, out);
    } else if (value instanceof Number || value instanceof Boolean) {
      out.append(value);
    } else if (value instanceof Map) {
      out.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
        if (!first) {
          out.append(',');
        }
        first = false;
        quote(String.valueOf(e.getKey()), out);
        out.append(':');
        write(e.getValue(), out);
      }
      out.append('}');
    } else if (value instanceof List) {
      out.append('[');
      boolean first = true;
      for (Object item : (List<?>) value) {
        if (!first) {
          out.append(',');
        }
        first = false;
        write(item, out);
      }
      out.append(']');
    } else if (value instanceof long[]) {
      long[] a = (long[]) value;
      List<Object> items = new ArrayList<>();
      for (long x : a) {
        items.add(x);
      }
      write(items, out);
    } else {
      throw new IllegalArgumentException("cannot write " + value.getClass() + " as JSON");
    }
  }

  private static void quote(String text, StringBuilder out) {
    out.append('"');
    for (int k = 0; k < text.length(); k++) {
      char c = text.charAt(k);
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    out.append('"');
  }
}
