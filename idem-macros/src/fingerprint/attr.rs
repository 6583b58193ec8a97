//! Reading `#[fingerprint(...)]` on fields (and rejecting it elsewhere).

use std::collections::BTreeMap;

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, LitStr, Member, Path, Type};

use crate::errors::Errors;
use crate::rules::label;

/// A field as the encoding sees it.
pub(crate) struct Field {
    /// How the field is reached (`self.amount`, `self.0`).
    pub(crate) member: Member,
    /// The name written into the fingerprint (after `rename`).
    pub(crate) name: String,
    /// The field's type, for bounds.
    pub(crate) ty: Type,
    /// `#[fingerprint(with = path)]`.
    pub(crate) with: Option<Path>,
}

/// The fields that count, sorted by name, for one struct or variant.
pub(crate) struct FieldSet {
    pub(crate) style: Style,
    pub(crate) fields: Vec<Field>,
    /// Every member, counted or skipped (for patterns).
    pub(crate) members: Vec<Member>,
}

/// How a struct or variant spells its fields.
#[derive(Clone, Copy)]
pub(crate) enum Style {
    Named,
    Tuple,
    Unit,
}

/// The input's shape: one struct, or the variants of an enum.
pub(crate) enum Shape {
    Struct(FieldSet),
    Enum(Vec<(syn::Ident, FieldSet)>),
}

const CONTAINER: &str = "`#[fingerprint(...)]` goes on fields, not on the type: mark the fields to `skip`, `rename` or hash `with` a function";

const VARIANT: &str = "`#[fingerprint(...)]` goes on fields, not on variants; the variant's name is always part of the fingerprint";

/// Reads the whole input, recording every misuse in `errors`.
pub(crate) fn read(input: &DeriveInput, errors: &mut Errors) -> Shape {
    for attr in &input.attrs {
        if attr.path().is_ident("fingerprint") {
            errors.push_spanned(attr, CONTAINER);
        }
    }
    match &input.data {
        Data::Struct(data) => Shape::Struct(fields(&data.fields, errors)),
        Data::Enum(data) => {
            let mut labels = Labels::default();
            let variants = data.variants.iter().map(|variant| {
                let name = unraw(&variant.ident);
                labels.check(
                    &name,
                    variant.ident.span(),
                    "variant",
                    "rename the variant",
                    errors,
                );
                for attr in &variant.attrs {
                    if attr.path().is_ident("fingerprint") {
                        errors.push_spanned(attr, VARIANT);
                    }
                }
                (variant.ident.clone(), fields(&variant.fields, errors))
            });
            Shape::Enum(variants.collect())
        }
        Data::Union(data) => {
            errors.push_at(
                data.union_token.span,
                "`Fingerprint` cannot be derived for a union; implement it by hand",
            );
            Shape::Struct(FieldSet {
                style: Style::Unit,
                fields: Vec::new(),
                members: Vec::new(),
            })
        }
    }
}

fn fields(fields: &Fields, errors: &mut Errors) -> FieldSet {
    let style = match fields {
        Fields::Named(_) => Style::Named,
        Fields::Unnamed(_) => Style::Tuple,
        Fields::Unit => Style::Unit,
    };
    let mut out = Vec::new();
    let mut members = Vec::new();
    let mut names: BTreeMap<String, Span> = BTreeMap::new();
    let mut labels = Labels::default();
    for (index, field) in fields.iter().enumerate() {
        let member = match &field.ident {
            Some(ident) => Member::Named(ident.clone()),
            None => Member::Unnamed(index.into()),
        };
        members.push(member.clone());
        let options = options(&field.attrs, errors);
        if options.skip {
            continue;
        }
        let (name, name_span) = match (&options.rename, &field.ident) {
            (Some(rename), _) => (rename.value(), rename.span()),
            (None, Some(ident)) => (unraw(ident), ident.span()),
            (None, None) => (index.to_string(), field.ty.span()),
        };
        if names.contains_key(&name) {
            errors.push_at(
                name_span,
                format!("two fields are fingerprinted as `{name}`; each name may appear once (check the `rename`s)"),
            );
        } else {
            names.insert(name.clone(), name_span);
            labels.check(
                &name,
                name_span,
                "field",
                "give this field another name with `#[fingerprint(rename = \"...\")]`",
                errors,
            );
        }
        out.push(Field {
            member,
            name,
            ty: field.ty.clone(),
            with: options.with,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    FieldSet {
        style,
        fields: out,
        members,
    }
}

/// The labels seen so far in one struct, variant or enum, by the name they came from.
#[derive(Default)]
struct Labels(BTreeMap<u32, String>);

impl Labels {
    /// Records `name`'s label, or reports that an earlier name has the same one.
    fn check(&mut self, name: &str, span: Span, what: &str, fix: &str, errors: &mut Errors) {
        match self.0.get(&label(name)) {
            Some(earlier) => errors.push_at(
                span,
                format!(
                    "{what} `{name}` has the same fingerprint label as `{earlier}` (labels are a 32-bit hash of the name, and these two collide); {fix}"
                ),
            ),
            None => {
                self.0.insert(label(name), name.to_owned());
            }
        }
    }
}

fn unraw(ident: &syn::Ident) -> String {
    let text = ident.to_string();
    text.strip_prefix("r#").map(str::to_owned).unwrap_or(text)
}

#[derive(Default)]
struct Options {
    skip: bool,
    rename: Option<LitStr>,
    with: Option<Path>,
}

fn options(attrs: &[syn::Attribute], errors: &mut Errors) -> Options {
    let mut options = Options::default();
    let mut skip_span = None;
    for attr in attrs {
        if !attr.path().is_ident("fingerprint") {
            continue;
        }
        if let syn::Meta::Path(path) = &attr.meta {
            errors.push_spanned(path, "write `#[fingerprint(skip)]`, `#[fingerprint(rename = \"...\")]` or `#[fingerprint(with = path)]`");
            continue;
        }
        let parsed = attr.parse_nested_meta(|meta| {
            let key = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
            match key.as_str() {
                "skip" => {
                    if meta.input.peek(syn::Token![=]) || meta.input.peek(syn::token::Paren) {
                        return Err(meta.error("`skip` takes no value; write `#[fingerprint(skip)]`"));
                    }
                    if skip_span.is_some() {
                        return Err(meta.error("`skip` is given twice"));
                    }
                    skip_span = Some(meta.path.span());
                    options.skip = true;
                }
                "rename" => {
                    let literal: LitStr = meta.value()?.parse().map_err(|e| {
                        syn::Error::new(e.span(), "`rename` takes a string, e.g. `#[fingerprint(rename = \"amount\")]`")
                    })?;
                    if options.rename.is_some() {
                        return Err(syn::Error::new(meta.path.span(), "`rename` is given twice"));
                    }
                    options.rename = Some(literal);
                }
                "with" => {
                    let path: Path = meta.value()?.parse().map_err(|e| {
                        syn::Error::new(e.span(), "`with` takes a path to a function `fn(&T, &mut FingerprintHasher)`")
                    })?;
                    if options.with.is_some() {
                        return Err(syn::Error::new(meta.path.span(), "`with` is given twice"));
                    }
                    options.with = Some(path);
                }
                _ => {
                    let name = quote::ToTokens::to_token_stream(&meta.path).to_string().replace(' ', "");
                    return Err(meta.error(format!("unknown fingerprint attribute `{name}`; expected `skip`, `rename` or `with`")));
                }
            }
            Ok(())
        });
        if let Err(error) = parsed {
            errors.push(error);
        }
    }
    if let Some(span) = skip_span {
        if options.rename.is_some() || options.with.is_some() {
            errors.push_at(
                span,
                "a skipped field is never fingerprinted; drop `rename`/`with` or drop `skip`",
            );
        }
    }
    options
}
