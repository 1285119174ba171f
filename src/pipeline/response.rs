//! Step 7: the created response, which of its answers are stored, read whole up to the cap,
//! and made the record the store keeps.

use super::*;

/// What to do with the create's answer.
pub(super) enum Keep<R, B> {
    /// Store it.
    Store(R),
    /// Release the key and reply with this, unstored: the create answered that nothing took
    /// effect.
    Release(Response<ResponseBody<B>>),
    /// Keep the key pending and reply with this: the create may have taken effect.
    Pending(Rejection),
}

/// Step 7a: which answers are stored ([`StoredResponses`]).
pub(super) fn keep<ResBody, E>(
    response: Option<Result<Response<ResBody>, E>>,
    stored: StoredResponses,
) -> Keep<Response<ResBody>, ResBody> {
    let Some(response) = response else {
        tracing::error!("create panicked; the key stays pending");
        return Keep::Pending(Rejection::CreateFailed);
    };
    match (response, stored) {
        (Ok(response), stored) if !stored.stores(response.status()) => {
            let response =
                response.map(|body| ResponseBody::inner(body).with_outcome(Outcome::Unstored));
            Keep::Release(response)
        }
        (Ok(response), _) => Keep::Store(response),
        // An error is no answer: whether the create took effect is unknown, whatever the
        // policy, so the key stays taken.
        (Err(_), _) => {
            tracing::error!("create failed; the key stays pending");
            Keep::Pending(Rejection::CreateFailed)
        }
    }
}

/// Step 7b: the created response read whole (up to the cap) into what the store keeps, in a
/// future of its own (see the pipeline's module).
pub(super) fn collect<ResBody: Body<Data = Bytes>, O>(
    response: Response<ResBody>,
    settings: &Settings<O>,
) -> Collect<'_, ResBody, O> {
    let (head, body) = response.into_parts();
    Collect {
        read: body::ReadLimited::new(body, settings.config.response_limit),
        head: Some(head),
        settings,
    }
}

pin_project! {
    /// The future of [`collect`].
    pub(super) struct Collect<'a, B, O> {
        #[pin]
        read: body::ReadLimited<B>,
        head: Option<http::response::Parts>,
        settings: &'a Settings<O>,
    }
}

/// What [`collect`] read of a created response.
pub(super) enum Collected<B> {
    /// The response whole: stored and given.
    Whole(StoredResponse),
    /// A response over the cap: its compact record ([`compact`]), and the response to give,
    /// whole. Boxed: it is rare, and every decision would hold room for it.
    Over(Box<(StoredResponse, Response<ResponseBody<B>>)>),
}

impl<B: Body<Data = Bytes>, O> Future for Collect<'_, B, O> {
    type Output = Result<Collected<B>, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let read = std::task::ready!(this.read.poll(cx));
        Poll::Ready(stored(this.head.take(), read, this.settings))
    }
}

/// What the store keeps of a created response, and what is given: the response read whole,
/// or, past the cap, its compact record and the response itself; or why neither is.
pub(super) fn stored<B, O>(
    parts: Option<http::response::Parts>,
    read: body::Read<B>,
    settings: &Settings<O>,
) -> Result<Collected<B>, Rejection> {
    let Some(mut parts) = parts else {
        return Err(Rejection::CreateFailed);
    };
    let (body, trailers) = match read {
        body::Read::Whole(body, trailers) => (body, trailers),
        body::Read::Over(body) => {
            headers::retain_storable(&mut parts.headers, &settings.config.excluded_headers);
            tracing::warn!(
                cap = settings.config.response_limit,
                "created response over the cap: given whole, its record without the body"
            );
            let compact = compact(parts.status, &parts.headers);
            return Ok(Collected::Over(Box::new((
                compact,
                Response::from_parts(parts, body),
            ))));
        }
        body::Read::Failed(ReadError::TooLarge) => {
            tracing::error!(
                "created response past the size its body declared; the key stays pending"
            );
            return Err(Rejection::ResponseTooLarge);
        }
        body::Read::Failed(ReadError::Broken) => {
            tracing::error!("created response body failed; the key stays pending");
            return Err(Rejection::CreateFailed);
        }
    };
    headers::retain_storable(&mut parts.headers, &settings.config.excluded_headers);
    let Some(mut trailers) = trailers else {
        return Ok(Collected::Whole(StoredResponse::new(
            parts.status,
            parts.headers,
            body,
        )));
    };
    // The trailers are stored as the headers are: the same exclusions, within the same cap.
    headers::retain_storable(&mut trailers, &settings.config.excluded_headers);
    let trailer_bytes: usize = trailers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if body.len().saturating_add(trailer_bytes) > settings.config.response_limit {
        tracing::warn!(
            cap = settings.config.response_limit,
            "created response over the cap with its trailers: given whole, its record without the body"
        );
        let compact = compact(parts.status, &parts.headers);
        let body = ResponseBody::full_with_trailers(body, Some(trailers));
        return Ok(Collected::Over(Box::new((
            compact,
            Response::from_parts(parts, body),
        ))));
    }
    Ok(Collected::Whole(
        StoredResponse::new(parts.status, parts.headers, body).with_trailers(trailers),
    ))
}

/// The record of a created response over the cap: its status and headers, no body, and
/// [`IDEMPOTENT_BODY_OMITTED`](reply::IDEMPOTENT_BODY_OMITTED); the headers that describe
/// the body it no longer has are left out.
pub(super) fn compact(status: http::StatusCode, headers: &http::HeaderMap) -> StoredResponse {
    use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE};
    let mut kept = http::HeaderMap::with_capacity(headers.len() + 1);
    for (name, value) in headers {
        if ![CONTENT_LENGTH, CONTENT_ENCODING, CONTENT_RANGE].contains(name)
            && !matches!(
                name.as_str(),
                "content-md5" | "digest" | "content-digest" | "repr-digest"
            )
        {
            kept.append(name.clone(), value.clone());
        }
    }
    kept.insert(
        reply::IDEMPOTENT_BODY_OMITTED,
        HeaderValue::from_static("true"),
    );
    StoredResponse::new(status, kept, Bytes::new())
}
