//! The strictyaml-compatible loader: what it keeps as strings and what it refuses.

use cella_skills::yaml::{Dialect, Value, YamlError, load};

fn s(v: &str) -> Value {
    Value::Str(v.to_owned())
}

fn strict(text: &str) -> Result<Value, YamlError> {
    load(text, Dialect::Strict)
}

#[test]
fn all_scalars_are_strings_as_written() {
    let v = strict("a: yes\nb: 1.10\nc: null\nd: ~\ne:\nf: '0x1'\n").unwrap();
    assert_eq!(
        v,
        Value::Map(vec![
            ("a".into(), s("yes")),
            ("b".into(), s("1.10")),
            ("c".into(), s("null")),
            ("d".into(), s("~")),
            ("e".into(), s("")),
            ("f".into(), s("0x1")),
        ])
    );
}

#[test]
fn block_scalars_and_folding() {
    let v = strict("a: |\n  x\n  y\nb: >-\n  x\n  y\nc: x\n  y\n").unwrap();
    assert_eq!(v.get("a"), Some(&s("x\ny\n")));
    assert_eq!(v.get("b"), Some(&s("x y")));
    assert_eq!(v.get("c"), Some(&s("x y")));
}

#[test]
fn strictyaml_refusals() {
    let refused = [
        "a: {b: c}\n",
        "a: [b]\n",
        "a: &x b\nc: *x\n",
        "a: !!str b\n",
        "a: b\na: c\n",
        "a: b\n---\nc: d\n",
        "a: b\tc\n",
        "a:\tb\n",
        "a: b\u{7}\n",
        "<<: c\n",
        "description: Use when: colon\n",
        "a: @b\n",
    ];
    for text in refused {
        assert!(strict(text).is_err(), "strict accepted {text:?}");
    }
}

#[test]
fn tabs_allowed_where_strictyaml_allows_them() {
    assert_eq!(strict("a: 'b\tc'\n").unwrap().get("a"), Some(&s("b\tc")));
    assert_eq!(strict("a: b # x\ty\n").unwrap().get("a"), Some(&s("b")));
    assert_eq!(
        strict("a: |\n  x\ty\n").unwrap().get("a"),
        Some(&s("x\ty\n"))
    );
}

#[test]
fn permissive_accepts_what_strict_refuses() {
    let v = load(
        "a: {b: c}\nd: &x e\nf: *x\ng: [1, 2]\na2: x\na2: y\n",
        Dialect::Permissive,
    )
    .unwrap();
    assert_eq!(v.get("a"), Some(&Value::Map(vec![("b".into(), s("c"))])));
    assert_eq!(v.get("f"), Some(&s("e")));
    assert_eq!(v.get("a2"), Some(&s("y")));
}

#[test]
fn empty_and_scalar_documents_are_not_mappings() {
    assert!(matches!(strict("").unwrap(), Value::Str(_)));
    assert!(matches!(
        strict("# only a comment\n").unwrap(),
        Value::Str(_)
    ));
    assert!(matches!(strict("hello\n").unwrap(), Value::Str(_)));
    assert!(matches!(strict("- a\n").unwrap(), Value::Seq(_)));
}

#[test]
fn budgets_stop_alias_bombs_and_deep_nesting() {
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..8 {
        let prev = if i == 0 {
            "a".to_owned()
        } else {
            format!("l{}", i - 1)
        };
        bomb.push_str(&format!(
            "l{i}: &l{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
    }
    assert!(matches!(
        load(&bomb, Dialect::Permissive),
        Err(YamlError::Budget { .. })
    ));
    let deep = "a:\n".to_owned()
        + &(1..200)
            .map(|i| format!("{}b:\n", " ".repeat(i * 2)))
            .collect::<String>();
    assert!(matches!(
        load(&deep, Dialect::Permissive),
        Err(YamlError::Budget { .. })
    ));
}

#[test]
fn quoted_continuation_lines_at_column_zero_are_accepted_like_pyyaml() {
    let v = strict("description: \"wrapped\nat column zero\"\nb: 'x\n# not a comment'\n").unwrap();
    assert_eq!(v.get("description"), Some(&s("wrapped at column zero")));
    assert_eq!(v.get("b"), Some(&s("x # not a comment")));
}

#[test]
fn byte_order_marks_inside_are_text() {
    let v = strict("\u{feff}a: x\u{feff}y\n").unwrap();
    assert_eq!(v.get("a"), Some(&s("x\u{feff}y")));
}
