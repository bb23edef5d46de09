//! The module paths one Rust file names: its `use` trees and the `crate::`, `super::`,
//! `self::` paths of its code, each with the module it is written in. Read as tokens, not
//! parsed: comments and literals are skipped, and items under `#[cfg(test)]` are left out (a
//! file's own tests are no part of the structure).

/// One path a file names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The module the path is written in (the file's, or an inline module's inside it).
    pub module: Vec<String>,
    /// As written: `["super", "memory", "Watch"]`; a glob ends in `"*"`.
    pub path: Vec<String>,
    /// For a `use`: the name it brings in (its last segment, or what follows `as`).
    pub used_as: Option<String>,
}

/// What one file names, and what it declares that other files' paths may reach.
#[derive(Debug, Default)]
pub struct FileReferences {
    pub references: Vec<Reference>,
    /// Inline modules (`mod name { … }`), from the crate's root.
    pub inline_modules: Vec<Vec<String>>,
    /// Modules declared under `#[cfg(test)]` (`mod tests;`), from the crate's root.
    pub test_modules: Vec<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// What `text`, the file of module `module`, names.
pub fn read(module: &[String], text: &str) -> FileReferences {
    let tokens = tokens(text);
    let mut reader = Reader {
        tokens: &tokens,
        out: FileReferences::default(),
        modules: vec![(0, module.to_vec())],
        depth: 0,
    };
    reader.walk();
    reader.out
}

struct Reader<'t> {
    tokens: &'t [Token],
    out: FileReferences,
    /// The brace depth each module opened at, innermost last.
    modules: Vec<(usize, Vec<String>)>,
    depth: usize,
}

impl Reader<'_> {
    fn module(&self) -> Vec<String> {
        self.modules
            .last()
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    fn ident(&self, i: usize) -> Option<&str> {
        match self.tokens.get(i) {
            Some(Token::Ident(s)) => Some(s),
            _ => None,
        }
    }

    fn is(&self, i: usize, token: &Token) -> bool {
        self.tokens.get(i) == Some(token)
    }

    fn walk(&mut self) {
        let mut i = 0;
        while i < self.tokens.len() {
            i = match &self.tokens[i] {
                Token::Punct('#') => self.attributes(i),
                Token::Punct('{') => {
                    self.depth += 1;
                    i + 1
                }
                Token::Punct('}') => {
                    if self.modules.len() > 1
                        && self.modules.last().map(|m| m.0) == Some(self.depth)
                    {
                        self.modules.pop();
                    }
                    self.depth = self.depth.saturating_sub(1);
                    i + 1
                }
                Token::Ident(word) if word == "use" => self.use_tree(i + 1),
                Token::Ident(word) if word == "mod" => self.module_declaration(i),
                Token::Ident(_) => self.code_path(i),
                _ => i + 1,
            };
        }
    }

    /// `mod name { … }` opens an inline module; `mod name;` is a file, known from the tree.
    fn module_declaration(&mut self, i: usize) -> usize {
        if let (Some(name), true) = (self.ident(i + 1), self.is(i + 2, &Token::Punct('{'))) {
            let mut inner = self.module();
            inner.push(name.to_string());
            self.out.inline_modules.push(inner.clone());
            self.depth += 1;
            self.modules.push((self.depth, inner));
            return i + 3;
        }
        i + 1
    }

    /// Attributes from `#` on; the item after them is skipped when one is `#[cfg(test)]`.
    fn attributes(&mut self, mut i: usize) -> usize {
        let mut test = false;
        while self.is(i, &Token::Punct('#')) {
            let inner = self.is(i + 1, &Token::Punct('!'));
            let open = if inner { i + 2 } else { i + 1 };
            if !self.is(open, &Token::Punct('[')) {
                return i + 1;
            }
            let close = self.matching(open);
            test |= !inner
                && self.tokens[open + 1..close]
                    == [
                        Token::Ident("cfg".into()),
                        Token::Punct('('),
                        Token::Ident("test".into()),
                        Token::Punct(')'),
                    ];
            i = close + 1;
        }
        if test {
            self.skip_test_item(i)
        } else {
            i
        }
    }

    /// Skips one item; a `mod name;` among them is noted as a test module.
    fn skip_test_item(&mut self, mut i: usize) -> usize {
        let start = i;
        let mut nesting = 0usize;
        while let Some(token) = self.tokens.get(i) {
            match token {
                Token::Punct('(' | '[') => nesting += 1,
                Token::Punct(')' | ']') => nesting = nesting.saturating_sub(1),
                Token::Punct('{') => return self.matching(i) + 1,
                Token::Punct(';') if nesting == 0 => {
                    let words: Vec<&str> = (start..i).filter_map(|j| self.ident(j)).collect();
                    if let Some(at) = words.iter().position(|w| *w == "mod") {
                        if let Some(name) = words.get(at + 1) {
                            let mut module = self.module();
                            module.push(name.to_string());
                            self.out.test_modules.push(module);
                        }
                    }
                    return i + 1;
                }
                _ => {}
            }
            i += 1;
        }
        i
    }

    /// The index of the bracket that closes the one at `open`.
    fn matching(&self, open: usize) -> usize {
        let mut level = 0usize;
        for (j, token) in self.tokens.iter().enumerate().skip(open) {
            match token {
                Token::Punct('(' | '[' | '{') => level += 1,
                Token::Punct(')' | ']' | '}') => {
                    level -= 1;
                    if level == 0 {
                        return j;
                    }
                }
                _ => {}
            }
        }
        self.tokens.len() - 1
    }

    /// A `use` tree from `i` to its `;`, each leaf a reference.
    fn use_tree(&mut self, i: usize) -> usize {
        let mut leaves = Vec::new();
        let end = self.use_leaves(i, &[], &mut leaves);
        let module = self.module();
        for (path, used_as) in leaves {
            self.out.references.push(Reference {
                module: module.clone(),
                path,
                used_as,
            });
        }
        end
    }

    /// The leaves of the tree at `i` under `prefix`; returns the index after it.
    fn use_leaves(
        &self,
        mut i: usize,
        prefix: &[String],
        leaves: &mut Vec<(Vec<String>, Option<String>)>,
    ) -> usize {
        let mut path = prefix.to_vec();
        loop {
            match self.tokens.get(i) {
                Some(Token::Punct('{')) => {
                    i += 1;
                    while !self.is(i, &Token::Punct('}')) && i < self.tokens.len() {
                        i = self.use_leaves(i, &path, leaves);
                        if self.is(i, &Token::Punct(',')) {
                            i += 1;
                        }
                    }
                    return i + 1;
                }
                Some(Token::Punct('*')) => {
                    path.push("*".into());
                    leaves.push((path, None));
                    return i + 1;
                }
                Some(Token::PathSep) => i += 1,
                Some(Token::Ident(segment)) => {
                    // `use a::{self, …}` names `a` itself.
                    if segment != "self" || path.is_empty() {
                        path.push(segment.clone());
                    }
                    i += 1;
                    if !self.is(i, &Token::PathSep) {
                        let mut used_as = path.last().cloned();
                        if self.ident(i) == Some("as") {
                            used_as = self.ident(i + 1).map(str::to_string);
                            i += 2;
                        }
                        leaves.push((path, used_as));
                        return i;
                    }
                }
                _ => return i,
            }
        }
    }

    /// A path of the code from `i` (`super::watch::Rise`, `pool::Pool::new`): all of them are
    /// noted, the graph keeps those that lead to a module of the crate.
    fn code_path(&mut self, i: usize) -> usize {
        let follows_path =
            i > 0 && (self.is(i - 1, &Token::PathSep) || self.is(i - 1, &Token::Punct('$')));
        // `pub(in crate::analysis)` names who may see an item, not what it uses.
        let visibility = i > 2
            && self.ident(i - 1) == Some("in")
            && self.is(i - 2, &Token::Punct('('))
            && self.ident(i - 3) == Some("pub");
        if follows_path || visibility || !self.is(i + 1, &Token::PathSep) {
            return i + 1;
        }
        let mut path = Vec::new();
        let mut j = i;
        while let Some(segment) = self.ident(j) {
            path.push(segment.to_string());
            if !self.is(j + 1, &Token::PathSep) {
                j += 1;
                break;
            }
            j += 2;
        }
        self.out.references.push(Reference {
            module: self.module(),
            path,
            used_as: None,
        });
        j
    }
}

/// `text` as identifiers, `::` and single punctuation, without comments and literals.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        i = match c {
            _ if c.is_whitespace() => i + 1,
            '/' if next == Some('/') => skip_line(&chars, i),
            '/' if next == Some('*') => skip_block_comment(&chars, i),
            '"' => skip_string(&chars, i + 1),
            '\'' => skip_char_or_lifetime(&chars, i),
            ':' if next == Some(':') => {
                out.push(Token::PathSep);
                i + 2
            }
            _ if c.is_alphanumeric() || c == '_' => {
                if let Some(end) = raw_or_byte_literal(&chars, i) {
                    end
                } else {
                    let start = if c == 'r' && next == Some('#') {
                        i + 2
                    } else {
                        i
                    };
                    let mut end = start;
                    while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
                        end += 1;
                    }
                    out.push(Token::Ident(chars[start..end].iter().collect()));
                    end
                }
            }
            _ => {
                out.push(Token::Punct(c));
                i + 1
            }
        };
    }
    out
}

fn skip_line(chars: &[char], i: usize) -> usize {
    chars[i..]
        .iter()
        .position(|&c| c == '\n')
        .map_or(chars.len(), |n| i + n + 1)
}

/// Block comments nest in Rust.
fn skip_block_comment(chars: &[char], mut i: usize) -> usize {
    let mut level = 0usize;
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => {
                level += 1;
                i += 2;
            }
            ('*', '/') => {
                level -= 1;
                i += 2;
                if level == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// From just after an opening `"` to just after its closing one.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// `'a'`, `'\n'`, `'\u{1F600}'` are skipped; a lifetime's quote is dropped, its name stays.
fn skip_char_or_lifetime(chars: &[char], i: usize) -> usize {
    match (chars.get(i + 1), chars.get(i + 2)) {
        (Some('\\'), _) => chars[i + 2..]
            .iter()
            .position(|&c| c == '\'')
            .map_or(chars.len(), |n| i + 2 + n + 1),
        (Some(_), Some('\'')) => i + 3,
        _ => i + 1,
    }
}

/// The end of a `r"…"`, `r#"…"#`, `b"…"`, `br"…"` or `b'…'` literal starting at `i`.
fn raw_or_byte_literal(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars[j] == 'b' {
        j += 1;
        match chars.get(j) {
            Some('"') => return Some(skip_string(chars, j + 1)),
            Some('\'') => return Some(skip_char_or_lifetime(chars, j)),
            _ => {}
        }
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    if chars.get(j + hashes) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let body = j + hashes + 1;
    Some(
        (body..chars.len())
            .find(|&k| chars[k..].starts_with(&close))
            .map_or(chars.len(), |k| k + close.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(text: &str) -> Vec<String> {
        read(&["m".to_string()], text)
            .references
            .into_iter()
            .map(|r| r.path.join("::"))
            .collect()
    }

    #[test]
    fn grouped_uses_expand_to_each_leaf() {
        assert_eq!(
            paths("use super::{a, b::{self, c as d}, e::*};"),
            ["super::a", "super::b", "super::b::c", "super::e::*"]
        );
    }

    #[test]
    fn code_paths_are_read_and_literals_and_comments_are_not() {
        let text = r##"
            // use super::commented;
            /* crate::x::y /* nested */ crate::z */
            fn f<'a>(s: &'a str) -> char { let _ = "super::quoted"; let _ = r#"crate::raw"#;
                super::watch::Rise::new(); '\'' }
            macro_rules! m { () => { $crate::skipped() } }
            pub(in crate::visibility) struct S;
        "##;
        assert_eq!(paths(text), ["super::watch::Rise::new"]);
    }

    #[test]
    fn test_items_are_left_out_and_their_files_noted() {
        let text = "#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline { use super::x; }\n\
                    #[cfg(test)]\nuse crate::y;\nmod real { use super::z; }";
        let read = read(&["m".to_string()], text);
        assert_eq!(read.test_modules, [vec!["m".to_string(), "tests".into()]]);
        assert_eq!(read.inline_modules, [vec!["m".to_string(), "real".into()]]);
        assert_eq!(read.references.len(), 1);
        assert_eq!(read.references[0].module, ["m", "real"]);
    }
}
