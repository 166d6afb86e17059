//! Screenshot images in the service worker: decoding a captured data URL and
//! re-encoding it smaller with an OffscreenCanvas (a worker has no DOM).
//! Nothing here decides sizes; `browser_tools` does, with the bounds in
//! `crate::model`.

use js_sys::{Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    Blob, ImageBitmap, ImageEncodeOptions, OffscreenCanvas, OffscreenCanvasRenderingContext2d,
    Response,
};

use super::error::{js_to_error, JsError};
use crate::model::{fit_within, ImageData};

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` with a URL (here: a `data:` URL).
    #[wasm_bindgen(js_name = fetch)]
    fn fetch_url(url: &str) -> Promise;

    /// The global `createImageBitmap` (workers have it too).
    #[wasm_bindgen(catch, js_name = createImageBitmap)]
    fn create_image_bitmap(blob: &Blob) -> Result<Promise, JsValue>;
}

fn type_error(message: &str) -> JsError {
    JsError {
        name: "TypeError".into(),
        message: message.into(),
    }
}

async fn resolve<T: JsCast>(promise: Promise, what: &str) -> Result<T, JsError> {
    JsFuture::from(promise)
        .await
        .map_err(js_to_error)?
        .dyn_into::<T>()
        .map_err(|_| type_error(&format!("{what} returned something unexpected")))
}

/// A decoded image, closed when dropped.
pub struct Bitmap(ImageBitmap);

impl Bitmap {
    /// Decode a `data:image/…;base64,…` URL.
    pub async fn decode(data_url: &str) -> Result<Bitmap, JsError> {
        let response: Response = resolve(fetch_url(data_url), "fetch").await?;
        let blob: Blob = resolve(response.blob().map_err(js_to_error)?, "Response.blob").await?;
        let bitmap: ImageBitmap = resolve(
            create_image_bitmap(&blob).map_err(js_to_error)?,
            "createImageBitmap",
        )
        .await?;
        Ok(Bitmap(bitmap))
    }

    pub fn width(&self) -> u32 {
        self.0.width()
    }

    pub fn height(&self) -> u32 {
        self.0.height()
    }

    /// The image scaled down to at most `max_side` pixels on its longer side,
    /// as a JPEG of `quality` (0–1). Returns the image and its size.
    pub async fn jpeg(
        &self,
        max_side: u32,
        quality: f64,
    ) -> Result<(ImageData, u32, u32), JsError> {
        let (width, height) = fit_within(self.width(), self.height(), max_side);
        let canvas = OffscreenCanvas::new(width, height).map_err(js_to_error)?;
        let context: OffscreenCanvasRenderingContext2d = canvas
            .get_context("2d")
            .map_err(js_to_error)?
            .ok_or_else(|| type_error("OffscreenCanvas has no 2d context"))?
            .dyn_into()
            .map_err(|_| type_error("OffscreenCanvas returned another context"))?;
        // Downscaling by large factors looks much better with high-quality smoothing.
        let _ = Reflect::set(
            &context,
            &JsValue::from_str("imageSmoothingQuality"),
            &JsValue::from_str("high"),
        );
        context
            .draw_image_with_image_bitmap_and_dw_and_dh(
                &self.0,
                0.0,
                0.0,
                f64::from(width),
                f64::from(height),
            )
            .map_err(js_to_error)?;
        let options = ImageEncodeOptions::new();
        options.set_type("image/jpeg");
        options.set_quality(quality);
        let blob: Blob = resolve(
            canvas
                .convert_to_blob_with_options(&options)
                .map_err(js_to_error)?,
            "convertToBlob",
        )
        .await?;
        let buffer = JsFuture::from(blob.array_buffer())
            .await
            .map_err(js_to_error)?;
        let bytes = Uint8Array::new(&buffer).to_vec();
        Ok((ImageData::from_bytes("image/jpeg", &bytes), width, height))
    }
}

impl Drop for Bitmap {
    fn drop(&mut self) {
        self.0.close();
    }
}
