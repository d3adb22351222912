// Solves one reCAPTCHA v2 with the official anti-captcha client, unchanged,
// and prints the token as JSON. Key from PINGBACK_API_KEY.
'use strict';
const ac = require('@antiadmin/anticaptchaofficial');

ac.setAPIKey(process.env.PINGBACK_API_KEY);
ac.shutUp();
ac.solveRecaptchaV2Proxyless('https://a.example/login', '6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-')
  .then((token) => {
    console.log(JSON.stringify({ token }));
  })
  .catch((err) => {
    console.error('anti-captcha client failed:', err);
    process.exit(1);
  });
